package tools

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// execFS reaches the workspace by running small scripts inside the sandbox, for runtimes
// without host access to it. The sandbox confines them anyway; the scripts repeat the
// host-side rules (no symlinks on the path, regular files only) so both backends answer
// alike. Names containing a newline or a tab are not listed correctly.
type execFS struct {
	rt sandbox.Runtime
	id string
}

// guard cds to the workspace and refuses a path with a symlink on it. $1 is the
// workspace-relative path, already cleaned.
const guard = `set -f
cd ` + sandbox.WorkspacePath + ` || exit 90
p=$1
cur=.
IFS=/
for c in $p; do
  [ "$c" = . ] && continue
  cur="$cur/$c"
  [ -L "$cur" ] && exit 91
done
IFS=' '
`

const (
	readScript = guard + `[ -e "$p" ] || exit 92
[ -d "$p" ] && exit 94
[ -f "$p" ] || exit 93
s=$(wc -c < "$p")
[ "$s" -le "$2" ] || exit 95
exec cat -- "$p"`
	writeScript = guard + `if [ -e "$p" ]; then [ -d "$p" ] && exit 94; [ -f "$p" ] || exit 93; fi
d=$(dirname -- "$p")
mkdir -p -- "$d" 2>/dev/null || exit 97
cat > "$p" && chmod "$2" -- "$p"`
	listScript = guard + `[ -e "$p" ] || exit 92
[ -d "$p" ] || exit 97
cd -- "$p" || exit 90
set +f
for f in * .*; do
  case $f in .|..) continue;; esac
  [ -e "$f" ] || [ -L "$f" ] || continue
  if [ -L "$f" ]; then t=symlink; elif [ -d "$f" ]; then t=dir; elif [ -f "$f" ]; then t=file; else t=other; fi
  s=0
  [ "$t" = file ] && s=$(wc -c < "$f")
  m=$(stat -c %a -- "$f" 2>/dev/null || echo 0)
  printf '%s\t%s\t%s\t%s\n' "$t" "$s" "$m" "$f"
done`
)

func (e *execFS) run(ctx context.Context, script string, stdin []byte, args ...string) ([]byte, error) {
	res, err := e.rt.Exec(ctx, e.id, sandbox.ExecRequest{
		Argv:        append([]string{"sh", "-c", script, "fs"}, args...),
		Stdin:       stdin,
		Timeout:     30 * time.Second,
		OutputLimit: 64 << 20,
	})
	if err != nil {
		return nil, err
	}
	switch res.ExitCode {
	case 0:
		return res.Stdout, nil
	case 91:
		return nil, ErrSymlink
	case 92:
		return nil, ErrNotExist
	case 93:
		return nil, ErrSpecialFile
	case 94:
		return nil, ErrIsDir
	case 95:
		return nil, ErrTooLarge
	case 97:
		return nil, ErrNotDir
	default:
		return nil, fmt.Errorf("in-sandbox file access failed (exit %d): %s", res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
}

func (e *execFS) read(ctx context.Context, rel string, max int64) ([]byte, error) {
	return e.run(ctx, readScript, nil, rel, strconv.FormatInt(max, 10))
}

func (e *execFS) write(ctx context.Context, rel string, data []byte, mode uint32) error {
	_, err := e.run(ctx, writeScript, data, rel, strconv.FormatUint(uint64(mode), 8))
	return err
}

func (e *execFS) list(ctx context.Context, rel string) ([]Entry, error) {
	out, err := e.run(ctx, listScript, nil, rel)
	if err != nil {
		return nil, err
	}
	var es []Entry
	for _, line := range strings.Split(strings.TrimSuffix(string(out), "\n"), "\n") {
		f := strings.SplitN(line, "\t", 4)
		if len(f) != 4 {
			continue
		}
		size, _ := strconv.ParseInt(strings.TrimSpace(f[1]), 10, 64)
		mode, _ := strconv.ParseUint(f[2], 8, 32)
		es = append(es, Entry{Name: f[3], Type: f[0], Size: size, Mode: uint32(mode)})
	}
	slices.SortFunc(es, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	return es, nil
}
