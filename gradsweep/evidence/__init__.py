"""Signed closeout evidence: an in-toto Statement v1 in a DSSE envelope, Ed25519, RFC 8785 payload."""
