package ctrd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Shim start without the shim.
//
// containerd 1.6 creates every task by running the runtime's shim binary with the "start"
// command, even when the task joins a shim group whose shim already runs (shimgroup.go).
// For containerd-shim-runc-v2 that is a whole Go daemon brought up for one answer: it
// loads its 11 MB binary, reads the task's OCI spec for the group annotation, connects to
// containerd's event publisher, finds the group's socket in use and prints that socket's
// address (and writes it to the bundle's "address" file). It was the largest single piece
// of containerd's task creation (docs/benchmarks.md, Costs the code cites, containerd
// sandboxes).
//
// The runtime knows that address: the group's first sandbox got it from the real shim. So
// the sandboxes' runtime is a small sh script (containerd accepts an absolute path as the
// runtime name), written into the state directory, that answers "start" for a sandbox
// whose group address the runtime has handed it, in a file of the sandbox's state
// directory: it writes the bundle's "address" file as the shim would and prints the
// address. Every other call (a group's first start, "delete", anything unknown) execs the
// real shim with the same arguments, and a first start's answer is kept for the runtime to
// learn the group's address. The long-lived shim, the OCI runtime and the container are
// exactly those of before; only the one-shot "start" process is skipped.
//
// A group's address is used only while the group has live tasks (shimgroup.go). Should its
// shim have died anyway, containerd cannot connect, the task's creation fails, the group
// is sealed, and start tries once more in a new group (through the real shim). The script
// speaks containerd 1.x's start protocol: New installs it only for a 1.x daemon.

// shimStartName is the script's file name in the state directory's bin directory.
const shimStartName = "containerd-shim-gauntlet-v2"

// Files the script reads and writes in a sandbox's state directory.
const (
	shimAddressFile = "shim-address"         // the group's address, written by the runtime
	shimStartedFile = "shim-started-address" // the real shim's answer to a first start
)

// shimStartScript is the script for the real shim binary real and the sandboxes'
// state directories under sandboxes.
func shimStartScript(real, sandboxes string) string {
	return `#!/bin/sh
# containerd runtime of gauntlet's containerd sandboxes, written by package ctrd
# (pkg/sandbox/ctrd/shimstart.go): answers "start" for a sandbox joining a running shim,
# hands everything else to the real shim.
real=` + shellQuote(real) + `
sandboxes=` + shellQuote(sandboxes) + `
id= prev= action=
for a do
	if [ "$prev" = -id ]; then id=$a; fi
	prev=$a
done
action=$prev
case $id in
''|*/*|.*) exec "$real" "$@" ;;
esac
dir=$sandboxes/$id
if [ "$action" != start ] || [ ! -d "$dir" ]; then
	exec "$real" "$@"
fi
if [ -f "$dir/` + shimAddressFile + `" ]; then
	addr=
	IFS= read -r addr <"$dir/` + shimAddressFile + `"
	if [ -n "$addr" ]; then
		printf '%s' "$addr" >address || exit 1
		printf '%s' "$addr"
		exit 0
	fi
fi
out=$("$real" "$@") || exit $?
printf '%s\n' "$out" >"$dir/` + shimStartedFile + `"
printf '%s' "$out"
`
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// installShimStart writes the script into the state directory and returns its path; ""
// (and no error) when sandboxes do not share shims (nothing to answer: the script would
// only add a /bin/sh to every start) or the real shim is not installed where the script
// could find it, and the runtime then names the runc v2 shim as before.
func (r *Runtime) installShimStart() (string, error) {
	if r.opts.SandboxesPerShim == 1 {
		return "", nil
	}
	real := ""
	for _, d := range []string{"/usr/bin", "/usr/local/bin", "/usr/sbin", "/usr/local/sbin", "/bin", "/sbin"} {
		p := filepath.Join(d, "containerd-shim-runc-v2")
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			real = p
			break
		}
	}
	if real == "" {
		return "", nil
	}
	if _, err := os.Stat("/bin/sh"); err != nil {
		return "", nil
	}
	dir := filepath.Join(r.opts.StateDir, "bin")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("shim start script: %w", err)
	}
	path := filepath.Join(dir, shimStartName)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(shimStartScript(real, filepath.Join(r.opts.StateDir, "sandboxes"))), 0o700); err != nil {
		return "", fmt.Errorf("shim start script: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("shim start script: %w", err)
	}
	return path, nil
}

// runtimeName is the containerd runtime of new sandboxes: the start script, or the runc
// v2 shim when there is none (or the comparison benchmark turned it off).
func (r *Runtime) runtimeName() string {
	if r.shimStart != "" && !r.noShimStart {
		return r.shimStart
	}
	return "io.containerd.runc.v2"
}

// armShimStart tells the start script, for sandbox id, the address of group g's running
// shim, or clears what an earlier start of the same sandbox left. It reports whether the
// script will answer the start itself.
func (r *Runtime) armShimStart(id string, g *shimGroup) (bool, error) {
	dir := r.sandboxDir(id)
	if err := os.Remove(filepath.Join(dir, shimStartedFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	addr := r.shims.address(g)
	p := filepath.Join(dir, shimAddressFile)
	if addr == "" || r.runtimeName() != r.shimStart {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return false, err
		}
		return false, nil
	}
	if err := os.WriteFile(p, []byte(addr+"\n"), 0o600); err != nil {
		return false, err
	}
	return true, nil
}

// learnShimAddress records, after a start through the real shim, the address it gave
// (the script wrote it before printing it, so it is complete once the task exists).
func (r *Runtime) learnShimAddress(id string, g *shimGroup) {
	b, err := os.ReadFile(filepath.Join(r.sandboxDir(id), shimStartedFile))
	if err != nil {
		return // not started through the script (the runc v2 shim by name)
	}
	r.shims.setAddress(g, strings.TrimSpace(string(b)))
}
