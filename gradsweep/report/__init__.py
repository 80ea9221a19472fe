"""Reading evidence for people and CI: the matrix (table / markdown / JUnit), diff and merge."""
