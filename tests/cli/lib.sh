# Shared helpers for the trellis end-to-end tests. Source after setting TRELLIS and DATA:
#   TRELLIS=$1 DATA=$2; source "$(dirname "$0")/lib.sh"
# Gives $tmp (removed on exit), say, die, ok, scaled and expect_fail.

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[[ -x "$TRELLIS" ]] || { echo "FAIL: trellis binary '$TRELLIS' not found" >&2; exit 1; }
[[ -d "$DATA" ]] || { echo "FAIL: test data dir '$DATA' not found" >&2; exit 1; }
n_checks=0

say() { echo "check: $*"; }
die() { echo "FAIL: $*" >&2; exit 1; }
ok() { n_checks=$((n_checks + 1)); echo "  ok   $*"; }
# scaled N: N times TRELLIS_TEST_SLOWDOWN (src/util/slowdown.h: how many times slower than
# a native Release build this stage runs; 1 when unset), rounded: for time bounds and waits.
scaled() { awk -v n="$1" -v f="${TRELLIS_TEST_SLOWDOWN:-1}" 'BEGIN { printf "%d", n * f + 0.5 }'; }

# expect_fail REGEX -- CMD...: CMD must exit non-zero from an error, not a signal (0 < rc
# < 128), within 30 s (timeout exits 124), and print exactly one stderr line
# "trellis: ..." matching REGEX (extended, case-insensitive).
expect_fail() {
  local re=$1; shift; [[ $1 == -- ]] && shift
  local rc=0
  timeout 30 "$@" >"$tmp/ef.out" 2>"$tmp/ef.err" || rc=$?
  local err; err=$(cat "$tmp/ef.err")
  [[ $rc -ne 124 ]] || die "hung (killed after 30 s): $*"
  [[ $rc -ne 0 ]] || die "exit 0, expected an error: $*"
  [[ $rc -lt 128 ]] || die "killed by signal $((rc - 128)) (rc $rc): $* -- stderr: $err"
  [[ $(wc -l <"$tmp/ef.err") -eq 1 ]] || die "stderr is not one line: $* -- stderr: $err"
  [[ $err == "trellis: "* ]] || die "stderr does not start with 'trellis: ': $* -- stderr: $err"
  grep -qiE -- "$re" "$tmp/ef.err" || die "message does not match /$re/: $* -- stderr: $err"
  ok "rc=$rc: $err"
}
