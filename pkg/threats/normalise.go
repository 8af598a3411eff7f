package threats

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"path"
	"strconv"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// EventMatch is the safety event kind of a step whose action matches a known
// fingerprint: "threat_fingerprint: ID matches COMMAND (KINDS)". It is a flag, not
// something a sandbox saw, so the built-in safety component does not count it
// (pkg/scoring) and no fingerprint is made from it.
const EventMatch = "threat_fingerprint"

// dangerous are the safety event kinds a fingerprint is made from: attacks the sandbox
// refused. Resource limits (timeouts, memory, pids, disk, CPU, output) are not among
// them: honest programs hit those.
var dangerous = []string{
	string(sandbox.EventSyscallDenied), string(sandbox.EventEgress), string(sandbox.EventDeviceAccess),
	string(tools.EventPathTraversal), string(tools.EventSymlink), string(tools.EventSpecialFile),
}

// Dangerous reports whether a safety event kind is one fingerprints are made from.
func Dangerous(kind string) bool {
	for _, k := range dangerous {
		if k == kind {
			return true
		}
	}
	return false
}

// Event is one dangerous safety event of the step a fingerprint was made from, as a
// pattern: its kind, the system call behind it (ptrace, connect, sendto, open; empty for
// the workspace tools' refusals, which happen before any call), and the path or address
// it concerned with numbers as N (/dev/mem, N.N.N.N:N, ../../etc/passwd).
type Event struct {
	Kind    string `json:"kind"`
	Syscall string `json:"syscall,omitempty"`
	Path    string `json:"path,omitempty"`
}

// ParseEvent reads a step's safety event ("kind: detail", as the envs record a sandbox's
// sandbox.Event) into its pattern, and reports whether it is dangerous. The details are
// the runtimes' own wording (pkg/sandbox/safety, pkg/sandbox/tools); one that does not
// parse keeps its kind with no syscall or path.
func ParseEvent(ev string) (Event, bool) {
	kind, detail, _ := strings.Cut(ev, ": ")
	if !Dangerous(kind) {
		return Event{}, false
	}
	e := Event{Kind: kind}
	first, rest, _ := strings.Cut(detail, " ")
	switch kind {
	case string(sandbox.EventSyscallDenied):
		// "ptrace refused with EPERM: pid 12 (perl)"
		if strings.HasPrefix(rest, "refused") {
			e.Syscall = first
		}
	case string(sandbox.EventEgress):
		// "connect to 1.1.1.1:443 refused (no route out of the sandbox): pid 7 (bash)"
		if dst, ok := strings.CutPrefix(rest, "to "); ok {
			e.Syscall = first
			dst, _, _ = strings.Cut(dst, " ")
			e.Path = Text(dst)
		}
	case string(sandbox.EventDeviceAccess):
		// "/dev/mem opened: a decoy, ..."
		if strings.HasPrefix(first, "/dev/") {
			e.Syscall, e.Path = "open", first
		}
	default:
		// The tools' refusals: `fs.read "../../etc/passwd": why`
		if q, _, ok := strings.Cut(rest, ": "); ok {
			if p, err := strconv.Unquote(q); err == nil {
				e.Path = Path(p)
			}
		}
	}
	return e, true
}

// Normalise returns the command a step's action stands for, the part of a fingerprint a
// later action is compared with: for shell.exec its command line (Text), for the file
// tools the path they name (Path), for any other tool its arguments as text (Text). A
// shell.exec given standard input adds a digest of it. Two
// actions with the same tool and normalised command are the same threat.
func Normalise(tool string, args []byte) string {
	switch tool {
	case tools.ShellExec:
		var a struct {
			Command string `json:"command"`
			Stdin   string `json:"stdin"`
		}
		if json.Unmarshal(args, &a) == nil {
			if a.Stdin == "" {
				return Text(a.Command)
			}
			// What the command reads is part of what it does: one command line
			// running scripts given on stdin (the tasks oracle runs every solution so)
			// is as many threats as there are scripts.
			sum := sha256.Sum256([]byte(a.Stdin))
			return Text(a.Command) + " <stdin sha256:" + hex.EncodeToString(sum[:8]) + ">"
		}
	case tools.FSRead, tools.FSWrite, tools.FSList, tools.FSPatch:
		var a struct {
			Path string `json:"path"`
		}
		if json.Unmarshal(args, &a) == nil {
			return Path(a.Path)
		}
	}
	return Text(string(args))
}

// Text normalises a command line so that the variants an agent produces of one attack,
// or that differ only by what changes from run to run, compare equal:
//
//   - quotes (' and ") are dropped: `cat "/dev/mem"` runs what `cat /dev/mem` runs;
//   - runs of blanks (spaces, tabs, newlines) become one space, and the ends are trimmed;
//   - every number becomes N: decimal runs, and 0x-prefixed hexadecimal ones. Process
//     ids, ports, addresses, sizes and syscall numbers change between attempts of one
//     attack (`kill -9 4711`, `nc 10.0.0.7 4444`), so they are variables, not identity.
//
// Letters, paths and operators are kept as they are: they are what the command does.
func Text(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	space := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'' || c == '"':
			continue
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			space = b.Len() > 0
			continue
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		if isDigit(c) {
			if c == '0' && i+2 < len(s) && (s[i+1] == 'x' || s[i+1] == 'X') && isHex(s[i+2]) {
				i += 2
				for i+1 < len(s) && isHex(s[i+1]) {
					i++
				}
			} else {
				for i+1 < len(s) && isDigit(s[i+1]) {
					i++
				}
			}
			b.WriteByte('N')
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// Path normalises a path a tool names: Text, then path.Clean, so `a//b/./c` and `a/b/c`
// are one path; a leading `..` stays, since escaping the workspace is the point.
func Path(p string) string {
	t := Text(p)
	if t == "" {
		return ""
	}
	return path.Clean(t)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isHex(c byte) bool { return isDigit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }
