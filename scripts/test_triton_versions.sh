#!/usr/bin/env bash
# Run the Triton interpreter tests under other triton releases, each in its own virtualenv.
#
#   bash scripts/test_triton_versions.sh 3.6.0 3.9.0                    # the kernel tests (default list)
#   bash scripts/test_triton_versions.sh 3.9.0 -- tests/ -x             # any pytest arguments after --
#
# Why: setup.sh pins triton 3.6.0 (the H200 image's release) while users get the current one; the
# interpreter changes between releases (3.9 rejects masks 3.6 accepted). Each venv gets torch pinned as in
# setup.sh (never a range), the given triton and the project's runtime dependencies read from
# pyproject.toml. The checkout is used through PYTHONPATH, never installed: an editable install would
# rebuild (or remove) the compiled gradsweep._C of the shared .venv.
#
# Venvs live in $GRADSWEEP_TRITON_VENVS (default ~/.cache/gradsweep/triton-venvs/<version>) and are reused.
# Exit status: 0 when every version passes, 1 otherwise (a summary line per version at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
PY=${PYTHON:-python3}
TORCH_SPEC=${GRADSWEEP_TORCH_SPEC:-torch==2.13.0}
root=${GRADSWEEP_TRITON_VENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/gradsweep/triton-venvs}

versions=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do versions+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
if [ ${#versions[@]} -eq 0 ]; then
  echo "usage: bash scripts/test_triton_versions.sh VERSION... [-- PYTEST_ARGS...]" >&2
  exit 2
fi
if [ $# -gt 0 ]; then
  pytest_args=("$@")
else
  pytest_args=(tests/test_triton_rowwise.py tests/test_triton_gemm_vocab.py tests/test_triton_attention.py
               tests/test_portable_dot.py tests/test_fold_plans.py tests/test_canonical_workload.py)
fi

# Runtime dependencies of the project (pyproject.toml [project].dependencies) plus pytest.
mapfile -t deps < <("$PY" - <<'PY'
import re
text = open("pyproject.toml", encoding="utf-8").read()
try:
    import tomllib
    deps = tomllib.loads(text)["project"]["dependencies"]
except ModuleNotFoundError:  # python 3.10: the list is flat, one quoted requirement per entry
    block = re.search(r"^dependencies\s*=\s*\[(.*?)\]", text, re.S | re.M).group(1)
    deps = re.findall(r'"([^"]+)"', block)
print("\n".join([*deps, "pytest>=8"]))
PY
)

summary=()
failed=0
for v in "${versions[@]}"; do
  venv="$root/$v"
  echo "=== triton $v ($venv)"
  if [ ! -x "$venv/bin/python" ]; then
    "$PY" -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install -q "$TORCH_SPEC" "triton==$v" "${deps[@]}"
  got=$("$venv/bin/python" -c "import triton; print(triton.__version__)")
  if [ "$got" != "$v" ]; then
    echo "triton $v: venv has triton $got" >&2
    summary+=("triton $v: FAIL (installed $got)")
    failed=1
    continue
  fi
  if (cd "$repo" && PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/python" -m pytest -q \
      -p no:cacheprovider "${pytest_args[@]}"); then
    summary+=("triton $v: PASS")
  else
    summary+=("triton $v: FAIL")
    failed=1
  fi
done
printf '%s\n' "${summary[@]}"
exit $failed
