#!/usr/bin/env bash
# The Python package's checks, as .ci/run runs them (Debian's python3 with
# python3-onnx and python3-pytest):
#   1. the pytest suite against a mokopt binary built from this checkout;
#   2. a wheel built by build_wheel.py around that binary, installed into a
#      fresh virtual environment, finds and runs its bundled binary;
#   3. `pip install ./python` (offline: --no-build-isolation, Debian's setuptools).
# MOKOPT_BINARY=path uses that binary instead of building one.
set -euo pipefail
cd "$(dirname "$0")/.."
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "${MOKOPT_BINARY:-}" ]; then
  go build -o "$work/mokopt" ./cmd/mokopt
  export MOKOPT_BINARY=$work/mokopt
fi
"$py" -m pytest -q -p no:cacheprovider python/tests

"$py" python/build_wheel.py --arch amd64 --binary "$MOKOPT_BINARY" --out "$work/dist" >/dev/null
"$py" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install -q --no-index --no-deps "$work"/dist/mokopt-*-py3-none-manylinux_2_17_x86_64*.whl
(cd "$work" && env -u MOKOPT_BINARY PATH=/usr/bin:/bin "$work/venv/bin/python" - <<'PY'
import mokopt, os
b = mokopt.find_binary()
assert b.startswith(os.path.dirname(mokopt.__file__)), f"the wheel's binary was not found: {b}"
assert mokopt.version(), "the bundled binary printed no version"
print(f"wheel ok: {b} (mokopt {mokopt.version()}), py.typed: {os.path.exists(os.path.join(os.path.dirname(mokopt.__file__), 'py.typed'))}")
PY
)
"$py" -m venv --system-site-packages "$work/venv2"
"$work/venv2/bin/pip" install -q --no-index --no-build-isolation ./python
rm -rf python/build python/mokopt.egg-info
(cd "$work" && "$work/venv2/bin/python" -c 'import mokopt, sys; assert "venv2" in mokopt.__file__, mokopt.__file__; print("pip install ./python ok:", mokopt.__file__)')
