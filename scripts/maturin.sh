#!/usr/bin/env bash
# The one maturin both wheels are built with (the CPU wheel by scripts/install.sh, the CUDA
# wheel by scripts/build_cuda.sh): the pin in pyproject.toml's [build-system] requires, which
# `pip install .` and `python -m build` use too. Source this file, then:
#
#   dspark_maturin_pin     # prints the requirement, e.g. maturin==1.16.0
#   dspark_maturin ARGS    # runs that maturin (installing it with pip first when the
#                          # interpreter in $PYTHON, default python3, has another version)

_dspark_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

dspark_maturin_pin() {
    local pin
    pin="$(sed -n 's/^requires = \[.*"\(maturin==[0-9][0-9.]*\)".*/\1/p' "$_dspark_root/pyproject.toml")"
    if [[ -z "$pin" ]]; then
        echo "maturin.sh: no maturin==X.Y.Z pin in pyproject.toml [build-system] requires" >&2
        return 1
    fi
    echo "$pin"
}

dspark_maturin() {
    local py="${PYTHON:-python3}" pin have
    pin="$(dspark_maturin_pin)" || return 1
    have="$("$py" -m maturin --version 2>/dev/null | awk '{print $2}')"
    if [[ "maturin==$have" != "$pin" ]]; then
        echo "maturin.sh: installing $pin (found ${have:-none})" >&2
        "$py" -m pip install --disable-pip-version-check --quiet "$pin" || return 1
    fi
    "$py" -m maturin "$@"
}
