#!/usr/bin/env bash
# Apply what bench/gpu_slice.sh brought back to the results folder here.
#
#   bash bench/unpack_slice.sh PARTS_DIR [RESULTS]     # RESULTS defaults to results/paper
#
# PARTS_DIR holds results.tar.part00, part01, ...: one tar of the files the slice wrote or
# changed, and FILES, the list of every file the folder held after it. The new and changed
# files replace those here; a file here that FILES does not list (an analysis recomputed
# under another name, or dropped once its group grew) is removed. Nothing is changed if the
# parts do not make a whole tar.
set -euo pipefail
parts=${1:?usage: bash bench/unpack_slice.sh PARTS_DIR [RESULTS]}
results=${2:-results/paper}
ls "$parts"/results.tar.part* >/dev/null 2>&1 || { echo "unpack_slice: no results.tar.part* in $parts" >&2; exit 2; }
staged=$(mktemp -d)
trap 'rm -rf "$staged"' EXIT
cat "$parts"/results.tar.part* | tar xf - -C "$staged" || { echo "unpack_slice: the parts in $parts do not make a whole tar; nothing changed" >&2; exit 2; }
[ -f "$staged/FILES" ] || { echo "unpack_slice: the tar holds no FILES list; nothing changed" >&2; exit 2; }
mkdir -p "$results"
(cd "$staged" && find . -type f ! -name FILES) | while read -r file; do
    mkdir -p "$results/$(dirname "$file")"
    cp "$staged/$file" "$results/$file"
done
(cd "$results" && find . -type f | sort) | comm -23 - <(sort "$staged/FILES") | while read -r gone; do
    rm -f "$results/$gone"
done
find "$results" -type d -empty -delete
echo "unpack_slice: $results updated ($(cd "$staged" && find . -type f ! -name FILES | wc -l) files written)"
echo "unpack_slice: now render its pages: python tools/results_pages.py (docs/results-paper.md and the README's table)"
