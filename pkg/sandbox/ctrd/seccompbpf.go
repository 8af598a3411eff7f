package ctrd

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
)

// Precompiled seccomp.
//
// An OCI runtime compiles the spec's seccomp profile with libseccomp in every
// container start; for containerd's default profile (about 370 system calls for three
// architectures) that was the largest single cost left in a crun start. crun accepts a
// ready filter instead (annotation run.oci.seccomp_bpf_data: the raw struct
// sock_filter array, base64), so the runtime compiles the profile once, in Go, and
// hands every sandbox the same bytes.
//
// The compiled filter is the profile for the native architecture only: a system call
// from another architecture (i386 through int 0x80) kills the process, and an x32 one
// fails with the profile's default errno. That is stricter than the profile, which
// also allows the i386 and x32 calls. Everything else follows the profile rule by
// rule: a call whose name is listed is allowed (or gets the rule's errno) when one of
// its rules' argument conditions all hold, otherwise it gets the default action.
// Names the native architecture does not have are skipped, as libseccomp does.

// crunSeccompAnnotation carries a precompiled filter to crun.
const crunSeccompAnnotation = "run.oci.seccomp_bpf_data"

// seccomp return values and seccomp_data offsets (linux/seccomp.h).
const (
	seccompRetKillProcess = 0x80000000
	seccompRetErrno       = 0x00050000
	seccompRetAllow       = 0x7fff0000
	seccompDataNr         = 0
	seccompDataArch       = 4
	seccompDataArgs       = 16
)

// compileSeccomp compiles p for the native architecture. ok is false when it cannot
// (another architecture, a profile feature it does not handle): the OCI runtime then
// compiles p itself.
func compileSeccomp(p *specs.LinuxSeccomp) (prog []bpf.Instruction, ok bool, err error) {
	if p == nil || nativeAuditArch == 0 || len(p.Flags) > 0 || p.ListenerPath != "" {
		return nil, false, nil
	}
	if !slices.Contains(p.Architectures, specs.Arch(nativeSeccompArch)) {
		return nil, false, nil
	}
	def, err := seccompAction(p.DefaultAction, p.DefaultErrnoRet)
	if err != nil {
		return nil, false, fmt.Errorf("seccomp default action: %w", err)
	}
	// Rules of each system call, in profile order; a call listed under several rules
	// matches when any of them does.
	type rule struct {
		args []specs.LinuxSeccompArg
		ret  uint32
	}
	rules := map[uint32][]rule{}
	var order []uint32
	for _, sc := range p.Syscalls {
		ret, err := seccompAction(sc.Action, sc.ErrnoRet)
		if err != nil {
			return nil, false, fmt.Errorf("seccomp rule %v: %w", sc.Names, err)
		}
		for _, name := range sc.Names {
			nr, known := syscallNumbers[name]
			if !known {
				continue
			}
			if _, seen := rules[nr]; !seen {
				order = append(order, nr)
			}
			rules[nr] = append(rules[nr], rule{args: sc.Args, ret: ret})
		}
	}
	prog = []bpf.Instruction{
		bpf.LoadAbsolute{Off: seccompDataArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: nativeAuditArch, SkipTrue: 1},
		bpf.RetConstant{Val: seccompRetKillProcess},
		bpf.LoadAbsolute{Off: seccompDataNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpLessThan, Val: x32SyscallBit, SkipTrue: 1},
		bpf.RetConstant{Val: def},
	}
	for _, nr := range order {
		// Either one instruction (the call's action, unconditional) or a block that
		// tests the rules in turn and falls back to the default action.
		var block []bpf.Instruction
		for _, r := range rules[nr] {
			if len(r.args) == 0 {
				block = append(block, bpf.RetConstant{Val: r.ret})
				break // later rules of the call cannot matter
			}
			test, err := argsTest(r.args, r.ret)
			if err != nil {
				return nil, false, fmt.Errorf("seccomp rule for syscall %d: %w", nr, err)
			}
			block = append(block, test...)
		}
		if _, uncond := block[len(block)-1].(bpf.RetConstant); !uncond {
			block = append(block, bpf.RetConstant{Val: def})
		}
		if len(block) > 255 {
			return nil, false, fmt.Errorf("seccomp rules for syscall %d compile to %d instructions, more than a jump can skip", nr, len(block))
		}
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipFalse: uint8(len(block))})
		prog = append(prog, block...)
	}
	prog = append(prog, bpf.RetConstant{Val: def})
	if len(prog) > 4096 {
		return nil, false, fmt.Errorf("seccomp filter has %d instructions, the kernel takes 4096", len(prog))
	}
	return prog, true, nil
}

// argsTest returns instructions that return ret when every condition holds and fall
// through (to the next instruction after them) otherwise. They clobber A.
func argsTest(args []specs.LinuxSeccompArg, ret uint32) ([]bpf.Instruction, error) {
	// Each condition is a list of checks; a failing check jumps to the end of the whole
	// test, whose length is only known at the end, so jumps are patched afterwards.
	var out []bpf.Instruction
	var fails []int // indexes of JumpIf whose false branch must reach the end
	var failTrue []int
	for _, a := range args {
		if a.Index > 5 {
			return nil, fmt.Errorf("argument index %d out of range", a.Index)
		}
		lo := uint32(seccompDataArgs + 8*a.Index) // little-endian: low word first
		hi := lo + 4
		vlo, vhi := uint32(a.Value), uint32(a.Value>>32)
		switch a.Op {
		case specs.OpEqualTo, specs.OpNotEqual:
			// EQ: hi == vhi && lo == vlo. NE: the negation.
			out = append(out, bpf.LoadAbsolute{Off: hi, Size: 4})
			if a.Op == specs.OpEqualTo {
				fails = append(fails, len(out))
				out = append(out, bpf.JumpIf{Cond: bpf.JumpEqual, Val: vhi})
				out = append(out, bpf.LoadAbsolute{Off: lo, Size: 4})
				fails = append(fails, len(out))
				out = append(out, bpf.JumpIf{Cond: bpf.JumpEqual, Val: vlo})
			} else {
				// hi != vhi → holds: skip the low-word test.
				out = append(out, bpf.JumpIf{Cond: bpf.JumpEqual, Val: vhi, SkipFalse: 2})
				out = append(out, bpf.LoadAbsolute{Off: lo, Size: 4})
				failTrue = append(failTrue, len(out))
				out = append(out, bpf.JumpIf{Cond: bpf.JumpEqual, Val: vlo})
			}
		case specs.OpMaskedEqual:
			// (arg & Value) == ValueTwo, word by word.
			mlo, mhi := vlo, vhi
			dlo, dhi := uint32(a.ValueTwo), uint32(a.ValueTwo>>32)
			out = append(out, bpf.LoadAbsolute{Off: hi, Size: 4}, bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: mhi})
			fails = append(fails, len(out))
			out = append(out, bpf.JumpIf{Cond: bpf.JumpEqual, Val: dhi})
			out = append(out, bpf.LoadAbsolute{Off: lo, Size: 4}, bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: mlo})
			fails = append(fails, len(out))
			out = append(out, bpf.JumpIf{Cond: bpf.JumpEqual, Val: dlo})
		case specs.OpLessThan, specs.OpLessEqual, specs.OpGreaterThan, specs.OpGreaterEqual:
			// Unsigned 64-bit compare: decide on the high words when they differ,
			// else on the low words.
			var hiHolds, loCond bpf.JumpTest
			switch a.Op {
			case specs.OpLessThan:
				hiHolds, loCond = bpf.JumpLessThan, bpf.JumpLessThan
			case specs.OpLessEqual:
				hiHolds, loCond = bpf.JumpLessThan, bpf.JumpLessOrEqual
			case specs.OpGreaterThan:
				hiHolds, loCond = bpf.JumpGreaterThan, bpf.JumpGreaterThan
			default:
				hiHolds, loCond = bpf.JumpGreaterThan, bpf.JumpGreaterOrEqual
			}
			out = append(out, bpf.LoadAbsolute{Off: hi, Size: 4})
			// high words decide: holds → skip to the next condition (3 ahead).
			out = append(out, bpf.JumpIf{Cond: hiHolds, Val: vhi, SkipTrue: 3})
			fails = append(fails, len(out))
			out = append(out, bpf.JumpIf{Cond: bpf.JumpEqual, Val: vhi})
			out = append(out, bpf.LoadAbsolute{Off: lo, Size: 4})
			fails = append(fails, len(out))
			out = append(out, bpf.JumpIf{Cond: loCond, Val: vlo})
		default:
			return nil, fmt.Errorf("argument operator %q not handled", a.Op)
		}
	}
	out = append(out, bpf.RetConstant{Val: ret})
	end := len(out) // the instruction after the test
	for _, i := range fails {
		j := out[i].(bpf.JumpIf)
		d := end - i - 1
		if d > 255 {
			return nil, fmt.Errorf("argument test too long")
		}
		j.SkipFalse = uint8(d)
		out[i] = j
	}
	for _, i := range failTrue {
		j := out[i].(bpf.JumpIf)
		d := end - i - 1
		if d > 255 {
			return nil, fmt.Errorf("argument test too long")
		}
		j.SkipTrue = uint8(d)
		out[i] = j
	}
	return out, nil
}

// seccompAction is the filter return value of a profile action.
func seccompAction(a specs.LinuxSeccompAction, errnoRet *uint) (uint32, error) {
	switch a {
	case specs.ActAllow:
		return seccompRetAllow, nil
	case specs.ActErrno:
		e := uint32(1) // EPERM, as runc and crun default
		if errnoRet != nil {
			e = uint32(*errnoRet)
		}
		return seccompRetErrno | (e & 0xffff), nil
	case specs.ActKillProcess:
		return seccompRetKillProcess, nil
	default:
		return 0, fmt.Errorf("action %q not handled", a)
	}
}

// seccompBPFData is the base64 raw filter for crun, or "" when the profile cannot be
// precompiled. Compiled once per profile content.
func seccompBPFData(p *specs.LinuxSeccomp) (string, error) {
	prog, ok, err := compileSeccomp(p)
	if err != nil || !ok {
		return "", err
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return "", fmt.Errorf("assemble seccomp filter: %w", err)
	}
	buf := make([]byte, 0, 8*len(raw))
	for _, ins := range raw {
		buf = binary.NativeEndian.AppendUint16(buf, ins.Op)
		buf = append(buf, ins.Jt, ins.Jf)
		buf = binary.NativeEndian.AppendUint32(buf, ins.K)
	}
	return base64.StdEncoding.EncodeToString(buf), nil
}

// bpfCache holds compiled filters by profile (every sandbox of a runtime has the same
// profile: it depends only on the capabilities, which are always none).
type bpfCache struct {
	mu   sync.Mutex
	data map[string]string
}

func (c *bpfCache) get(p *specs.LinuxSeccomp) (string, error) {
	key, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("seccomp profile: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.data[string(key)]; ok {
		return d, nil
	}
	d, err := seccompBPFData(p)
	if err != nil {
		return "", err
	}
	if c.data == nil {
		c.data = map[string]string{}
	}
	c.data[string(key)] = d
	return d, nil
}
