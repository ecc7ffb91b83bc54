#!/usr/bin/env bash
# `make gpu-wheelhouse`: the wheels the lent GPU machine's image lacks, for `make gpu-check` there (it has no network).
#
# Run where the package registry is reachable. Writes the ignored folder wheelhouse/ with
#   - this checkout's own wheel (hf_vit_plus-*.whl), and
#   - Python 3.12 manylinux x86_64 wheels of what the package needs and the image does not hold (datasets, evaluate,
#     dill, multiprocess, ...), as pip resolves them against the image's releases: .ci/gpu-image.txt names what the
#     image holds (its `==` pins are the releases it holds), and nothing named there goes into the folder, except
#     what the image's release could not satisfy (fsspec: datasets caps it, and the image's release is not known).
# and prints its size, which must stay under WHEELHOUSE_LIMIT_MIB (56: the 64 MiB that travels with a checkout,
# less the checkout). Send it along with the checkout (`carry: ["wheelhouse"]`; docs/contributing/testing.md).
#
# Settings (environment): PYTHON (python3: any Python with pip, it only downloads), WHEELHOUSE (wheelhouse),
# WHEELHOUSE_LIMIT_MIB (56).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
WHEELHOUSE="${WHEELHOUSE:-wheelhouse}"
LIMIT_MIB="${WHEELHOUSE_LIMIT_MIB:-56}"
IMAGE_LIST=.ci/gpu-image.txt
# Kept even though the image holds a release: ones whose release there is not known and that datasets caps.
ALWAYS_KEEP="fsspec"
PIP=("$PYTHON" -m pip --disable-pip-version-check)
# The image's Python (3.12, x86-64, glibc 2.28 or newer)
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none)
for minor in $(seq 39 -1 17); do TARGET+=(--platform "manylinux_2_${minor}_x86_64"); done
TARGET+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)

normalize() { tr 'A-Z_.' 'a-z--'; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$WHEELHOUSE"
mkdir -p "$WHEELHOUSE"
echo '*' >"$WHEELHOUSE/.gitignore"

echo "gpu-wheelhouse: building this checkout's wheel"
"${PIP[@]}" wheel -q --no-deps -w "$WHEELHOUSE" . >"$work/wheel.log" 2>&1 || {
    cat "$work/wheel.log" >&2
    exit 1
}
own=$(ls "$WHEELHOUSE"/hf_vit_plus-*.whl)

# The image's pins (lines `name==version`) as constraints; every name it lists, as what it holds.
grep -E '^[A-Za-z0-9_.-]+==' "$IMAGE_LIST" >"$work/pins.txt"
sed -e 's/#.*//' -e 's/[=<>!~;[ ].*//' "$IMAGE_LIST" | grep -v '^$' | normalize | sort -u >"$work/image-names.txt"

# Twice: with the newest releases that fit the image's pins, and with datasets and evaluate at the package's lower
# bounds (.ci/constraints-oldest.txt), whose own bounds are wider (pyarrow, fsspec): the image's releases of those are
# not known, and pip, installing with --no-index, takes the newest set that the image's releases allow.
floors=$(grep -E '^(datasets|evaluate)==' .ci/constraints-oldest.txt | paste -sd' ')
: >"$work/resolved.txt"
for extra in "" "$floors"; do
    echo "gpu-wheelhouse: resolving for Python 3.12 against the image's releases${extra:+, with $extra}"
    # shellcheck disable=SC2086 # $extra: requirements separated by spaces
    PIP_CONSTRAINT=/dev/null "${PIP[@]}" install -q --dry-run --ignore-installed --report "$work/report.json" \
        --target "$work/t" "${TARGET[@]}" -c "$work/pins.txt" "$own" $extra >"$work/resolve.log" 2>&1 || {
        grep -v "is ignored: it is neither a file nor a directory" "$work/resolve.log" >&2
        exit 1
    }
    "$PYTHON" -c 'import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    print(item["metadata"]["name"], item["metadata"]["version"])' "$work/report.json" >>"$work/resolved.txt"
done

: >"$work/wanted.txt"
while read -r name version; do
    key=$(printf '%s' "$name" | normalize)
    [[ "$key" == hf-vit-plus ]] && continue
    if grep -qx "$key" "$work/image-names.txt" && ! grep -qw -- "$key" <<<"$ALWAYS_KEEP"; then
        continue
    fi
    echo "$name==$version" >>"$work/wanted.txt"
done < <(sort -u "$work/resolved.txt")

echo "gpu-wheelhouse: downloading $(paste -sd' ' "$work/wanted.txt")"
# one at a time: two releases of one package (datasets above) in one `pip download` are a conflict to it
while read -r requirement; do
    PIP_CONSTRAINT=/dev/null "${PIP[@]}" download -q --no-deps "${TARGET[@]}" -d "$WHEELHOUSE" "$requirement" \
        >"$work/download.log" 2>&1 || {
        grep -v "is ignored: it is neither a file nor a directory" "$work/download.log" >&2
        exit 1
    }
done <"$work/wanted.txt"

size_kib=$(du -sk --exclude=.gitignore "$WHEELHOUSE" | cut -f1)
echo "gpu-wheelhouse: $WHEELHOUSE/ holds $(ls "$WHEELHOUSE"/*.whl | wc -l) wheels, $((size_kib / 1024)) MiB" \
    "(${size_kib} KiB; limit ${LIMIT_MIB} MiB):"
ls -1 "$WHEELHOUSE"/*.whl | sed 's|.*/|  |'
if ((size_kib > LIMIT_MIB * 1024)); then
    echo "gpu-wheelhouse: over the ${LIMIT_MIB} MiB limit: it would not travel with the checkout" >&2
    exit 1
fi
