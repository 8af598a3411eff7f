//go:build linux

package process

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// mountinfo lines as a hybrid (v1 controllers + empty unified) host and a pure v2 host
// print them.
const (
	hybrid = `25 1 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
30 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,cpu,cpuacct
31 25 0:29 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
32 25 0:30 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,pids
`
	unified = `25 1 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
)

func TestDetectCgroups(t *testing.T) {
	h, err := parseCgroupMounts(strings.NewReader(hybrid))
	if err != nil || h.version != cgroupV1 {
		t.Fatalf("hybrid: %+v %v, want v1", h, err)
	}
	g := h.cgroup("gauntlet/x/sb")
	if got := g.dir("cpuacct"); got != "/sys/fs/cgroup/cpu,cpuacct/gauntlet/x/sb" {
		t.Errorf("cpuacct dir %s", got)
	}
	// cpu and cpuacct share a hierarchy: the process joins it once.
	if got := g.procsFiles(); len(got) != 3 {
		t.Errorf("procs files %v, want 3 distinct hierarchies", got)
	}

	h, err = parseCgroupMounts(strings.NewReader(unified))
	if err != nil || h.version != cgroupV2 {
		t.Fatalf("unified: %+v %v, want v2", h, err)
	}
	g = h.cgroup("gauntlet/x/sb")
	if got := g.procsFiles(); len(got) != 1 || got[0] != "/sys/fs/cgroup/gauntlet/x/sb/cgroup.procs" {
		t.Errorf("v2 procs files %v", got)
	}

	noPids := strings.ReplaceAll(hybrid, "rw,pids", "rw,freezer")
	if _, err := parseCgroupMounts(strings.NewReader(noPids)); !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "pids") {
		t.Fatalf("no pids controller: %v, want ErrUnavailable naming pids", err)
	}
}

func TestSeccompProgram(t *testing.T) {
	prog, err := seccompProgram()
	if err != nil {
		t.Fatal(err)
	}
	if len(prog)%8 != 0 {
		t.Fatalf("program is %d bytes, not whole instructions", len(prog))
	}
	n := len(prog) / 8
	ins := func(i int) (code uint16, jt, jf uint8, k uint32) {
		b := prog[8*i:]
		return binary.NativeEndian.Uint16(b), b[2], b[3], binary.NativeEndian.Uint32(b[4:])
	}
	if code, _, _, k := ins(0); code != bpfLdWAbs || k != offArch {
		t.Errorf("first instruction loads %d, want the arch", k)
	}
	if code, _, _, k := ins(n - 1); code != bpfRetK || k&0xffff0000 != retErrno {
		t.Errorf("last instruction %x %x, want the errno return", code, k)
	}
	if _, _, _, k := ins(n - 2); k != retAllow {
		t.Errorf("second last returns %x, want allow", k)
	}
	// Every deny jump lands on the errno return.
	for i := 0; i < n; i++ {
		code, jt, _, _ := ins(i)
		if code == bpfJeqK && i > 1 || code == bpfJgeK {
			if i+1+int(jt) != n-1 {
				t.Errorf("instruction %d jumps to %d, want %d", i, i+1+int(jt), n-1)
			}
		}
	}
}
