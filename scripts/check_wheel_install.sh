#!/usr/bin/env bash
# Does the built wheel install where its metadata says it does?
#
#   scripts/check_wheel_install.sh [PYTHON...]
#
# Builds the wheel, then for each interpreter (default: python3.10,
# python3.11 and python3.12 from PATH or pyenv) makes a fresh venv and runs
# `pip install <wheel>`. On 3.11 and 3.12 the install must succeed and
# `aibrix-eic check` must pass on the embedded engine; on any other version
# (3.10, 3.13) pip must refuse it because of Requires-Python. torch==2.13.0 is installed first in
# each venv (an unpinned torch would resolve to a multi-GB CUDA build where a
# CPU wheel is available). Not part of `make test`: it downloads packages
# and takes minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_PIN=${TORCH_PIN:-torch==2.13.0}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/aibrix-eic-install.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

find_python() {  # $1 = 3.11 etc.
    if command -v "python$1" >/dev/null 2>&1; then command -v "python$1"; return; fi
    local root
    root=$(pyenv root 2>/dev/null || true)
    if [ -n "$root" ]; then
        # the newest installed patch release of that minor version
        ls -d "$root"/versions/"$1".*/bin/python"$1" 2>/dev/null | sort -V | tail -1
    fi
}

python3 -m pip wheel --no-deps --disable-pip-version-check -q -w "$WORK/dist" . >/dev/null
WHEEL=$(ls "$WORK"/dist/aibrix_eic-*.whl)
echo "wheel: $(basename "$WHEEL")"

if [ $# -eq 0 ]; then
    set -- "$(find_python 3.10)" "$(find_python 3.11)" "$(find_python 3.12)"
fi

failures=0
for python in "$@"; do
    if [ -z "$python" ] || [ ! -x "$python" ]; then
        echo "SKIP  ${python:-an interpreter}: not installed"
        continue
    fi
    version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    venv="$WORK/venv-$version"
    "$python" -m venv "$venv"
    # A current pip: the one bundled with Python 3.10 (23.0) resolves the
    # dependencies first and reports the missing aibrix-kvcache wheel instead
    # of our Requires-Python.
    "$venv/bin/python" -m pip install --disable-pip-version-check -q -U pip >/dev/null 2>&1 || true
    pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
    log="$WORK/pip-$version.log"
    supported=$("$python" -c 'import sys; print(int((3, 11) <= sys.version_info[:2] < (3, 13)))')
    if [ "$supported" = 0 ]; then
        # Expected: refused before anything is downloaded.
        if "${pip[@]}" "$WHEEL" >"$log" 2>&1; then
            echo "FAIL  $version: pip installed the wheel; Requires-Python should refuse it"
            failures=$((failures + 1))
        elif grep -q "requires a different Python" "$log"; then
            echo "PASS  $version: refused: $(grep -o "ERROR: Package 'aibrix-eic' requires a different Python.*" "$log")"
        else
            echo "FAIL  $version: pip failed for another reason:"; tail -5 "$log"
            failures=$((failures + 1))
        fi
        continue
    fi
    if ! "${pip[@]}" "$TORCH_PIN" >"$log" 2>&1 || ! "${pip[@]}" "$WHEEL" >>"$log" 2>&1; then
        echo "FAIL  $version: pip install failed:"; tail -5 "$log"
        failures=$((failures + 1))
        continue
    fi
    if out=$(cd "$WORK" && "$venv/bin/aibrix-eic" check 2>&1); then
        echo "PASS  $version: installed; $("$venv/bin/aibrix-eic" --version 2>/dev/null || echo aibrix-eic); check: $(echo "$out" | tail -1)"
    else
        echo "FAIL  $version: installed, but aibrix-eic check failed:"; echo "$out" | tail -5
        failures=$((failures + 1))
    fi
done
exit $((failures > 0))
