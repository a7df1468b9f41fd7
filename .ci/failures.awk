# failures.awk summarizes `go test` output (plain, not -json) for CI: for
# every failing test, in order, its name, its package and the messages it
# reported itself (file.go:N: lines from t.Error, t.Fatal, t.Log) without
# the structured log records tests route through t.Log (slog text or
# JSON), which would otherwise bury the assertion; then compile errors.
# Usage: awk -f .ci/failures.awk test.log
function indent(s) { match(s, /^ */); return RLENGTH }
/^ *--- FAIL: / {
	d = indent($0) / 4
	name = $0
	sub(/^ *--- FAIL: /, "", name)
	sub(/ \([0-9.]+s\)$/, "", name)
	n++
	test[n] = name
	at[d] = n
	depth = d
	next
}
/^ *--- (PASS|SKIP): / { depth = -1; next }
/^(ok|FAIL)[ \t]/ {
	# The package line closes that package's tests.
	if (split($0, f, /[ \t]+/) >= 2) {
		for (i = done + 1; i <= n; i++) pkg[i] = f[2]
		done = n
	}
	depth = -1
	next
}
/^(FAIL|PASS|panic:)/ { depth = -1; next }
/^[^ \t#][^ ]*\.go:[0-9]+:[0-9]+: / { build = build $0 "\n"; next }
depth >= 0 && indent($0) == 4 * (depth + 1) && $0 ~ /^ *[A-Za-z0-9_.-]+\.go:[0-9]+: / {
	msg = $0
	sub(/^ *[A-Za-z0-9_.-]+\.go:[0-9]+: /, "", msg)
	if (msg ~ /^time=[0-9]/ || msg ~ /^\{"time":/) next
	k = at[depth]
	own[k] = own[k] "    " substr($0, indent($0) + 1) "\n"
}
END {
	for (i = 1; i <= n; i++) {
		printf "--- FAIL: %s", test[i]
		if (i in pkg) printf " (%s)", pkg[i]
		printf "\n%s", own[i]
	}
	if (build != "") printf "compile errors:\n%s", build
}
