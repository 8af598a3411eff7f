# launcher.sh is sourced by the scripts that run one of gauntlet's launchers in the
# background (containerd.sh, registry.sh), so that starting, stopping and asking after
# one works the same for all of them. The launcher is a Go command of this repository
# that takes -dir and -ready-file, writes what callers need (a socket path, a host:port)
# to the ready file once its server answers, and stops its server on SIGTERM.
#
#   launcher_main CMD DIR NAME WHAT LOGS PACKAGE [ARG...]
#
# CMD is start, stop or status; DIR the launcher's folder; NAME the calling script's
# name for messages; WHAT the server in words ("containerd"); LOGS the logs to read when
# it does not answer; PACKAGE the launcher (./cmd/...), built into DIR/bin; ARGs go to
# the launcher after -dir and -ready-file. The caller has cd'ed to the repository's root
# and made DIR absolute. Exit status: 0, 1 on a failed start, 2 on a bad CMD, 3 from
# status when stopped.

launcher_main() {
	local cmd=$1 dir=$2 name=$3 what=$4 logs=$5 pkg=$6
	shift 6
	local pidfile="$dir/launcher.pid" ready="$dir/ready" bin
	bin="$dir/bin/$(basename "$pkg")"
	running() { [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

	case $cmd in
	start)
		if running; then
			cat "$ready"
			return 0
		fi
		mkdir -p "$dir/bin"
		go build -o "$bin" "$pkg"
		rm -f "$ready"
		nohup "$bin" -dir "$dir" -ready-file "$ready" "$@" >"$dir/launcher.log" 2>&1 &
		echo $! >"$pidfile"
		for _ in $(seq 600); do
			if [[ -s $ready ]]; then
				cat "$ready"
				return 0
			fi
			if ! running; then
				echo "$name: the launcher exited; its log:" >&2
				tail -n 40 "$dir/launcher.log" >&2
				return 1
			fi
			sleep 0.05
		done
		echo "$name: $what did not answer within 30 s; see $logs" >&2
		return 1
		;;
	stop)
		if running; then
			local pid
			pid=$(cat "$pidfile")
			kill -TERM "$pid"
			for _ in $(seq 600); do
				kill -0 "$pid" 2>/dev/null || break
				sleep 0.05
			done
		fi
		rm -f "$pidfile" "$ready"
		;;
	status)
		if running; then
			echo "running: $(cat "$ready" 2>/dev/null)"
		else
			echo "stopped"
			return 3
		fi
		;;
	*)
		echo "usage: $name start|stop|status [DIR]" >&2
		return 2
		;;
	esac
}
