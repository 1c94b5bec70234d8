#!/bin/sh
# A stand-in for ncu in tests (no GPU here): skips ncu's options, runs the target, then writes a line
# with the uid and network state it ran under and the hand-written sample CSV to --log-file.
here=$(dirname "$0")
log=""
while [ $# -gt 0 ]; do
  case "$1" in
    --csv) shift;;
    --log-file) log="$2"; shift 2;;
    --*) shift 2;;
    *) break;;
  esac
done
"$@" > "$log.target" 2>&1 || { echo "target failed"; cat "$log.target"; exit 3; }
{
  echo "# fake ncu: uid=$(id -u) target=$(tail -n 1 "$log.target")"
  cat "$here/ncu_details_handwritten.csv"
} > "$log"
