#!/bin/sh
# Server-side instructions per handshake for every case of the provider benchmark, under
# callgrind: each case runs twice (N and 2N handshakes, the same warm-up before both) and the
# difference over N is the figure, so set-up and warm-up cancel out. Deterministic, unlike CPU
# time on a shared machine, but valgrind's CPU lacks AVX-512, which aws-lc uses natively for RSA.
#   sh benches/tls-providers/callgrind.sh [N=100]
set -eu
here=$(dirname "$0")
n=${1:-100}
cargo build --release --quiet --manifest-path "$here/Cargo.toml"
bin="$here/target/release/tls-providers"
out=$(mktemp -d)
count() { # FILTER HANDSHAKES -> instructions inside server_step
    valgrind --tool=callgrind --callgrind-out-file="$out/cg" --toggle-collect='*server_step*' \
        "$bin" 1 "$2" "$1" >/dev/null 2>"$out/log"
    callgrind_annotate "$out/cg" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
}
"$bin" 1 1 | tail -n +2 | cut -c1-52 | while read -r line; do
    one=$(count "$line" "$n")
    two=$(count "$line" $((2 * n)))
    echo "$line  $(( (two - one) / n )) instructions"
done
rm -r "$out"
