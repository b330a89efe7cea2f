# Helpers shared by the bench scripts (sourced, not run). W must name the
# work folder.

# once NAME CMD...: runs CMD once, after a sync (so that no run writes back
# the dirty pages of an earlier one), under an address-space cap of
# ONCE_ULIMIT_KB KiB when that is set, and keeps per NAME the fastest wall
# time (s) in BEST_WALL, with that run's CPU time (user+sys, s) in BEST_CPU
# and peak RSS (KiB) in BEST_RSS. A failing command ends the script. Run
# the commands of a comparison in turn, REPS rounds, so that a slow spell of
# a shared machine hits all of them alike.
declare -A BEST_WALL BEST_CPU BEST_RSS
once() {
	local name=$1
	shift
	sync
	if ! (
		if [[ -n ${ONCE_ULIMIT_KB:-} ]]; then ulimit -v "$ONCE_ULIMIT_KB"; fi
		/usr/bin/time -f "%e %U %S %M" -o "$W/time.$name" "$@" >"$W/out.$name" 2>"$W/err.$name"
	); then
		echo "$name failed:" >&2
		tail -5 "$W/err.$name" >&2
		exit 1
	fi
	local wall user sys rss
	read -r wall user sys rss <"$W/time.$name"
	if [[ -z ${BEST_WALL[$name]:-} ]] || awk "BEGIN{exit !($wall < ${BEST_WALL[$name]})}"; then
		BEST_WALL[$name]=$wall BEST_CPU[$name]=$(awk "BEGIN{print $user + $sys}") BEST_RSS[$name]=$rss
	fi
}

# measure NAME CMD...: REPS runs of CMD in a row; sets T_WALL, T_CPU and
# T_RSS of the fastest.
measure() {
	local name=$1
	unset "BEST_WALL[$name]"
	for ((r = 0; r < REPS; r++)); do
		once "$@"
	done
	T_WALL=${BEST_WALL[$name]} T_CPU=${BEST_CPU[$name]} T_RSS=${BEST_RSS[$name]}
}

# ratio A B: A / B to two decimals ("inf" when B is 0).
ratio() { awk "BEGIN{ if ($2 > 0) printf \"%.2f\", $1 / $2; else print \"inf\" }"; }
