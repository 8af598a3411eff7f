package childproc_test

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
)

// leaderExitsEnv makes the test binary, run as a child, end its main thread alone while
// another thread runs on for leaderOutlived: the state a multi-threaded server killed
// with SIGKILL passes through, its main thread a zombie while the others still exit and
// still hold its open files (ClickHouse's lock on its data directory, say).
const leaderExitsEnv = "GAUNTLET_TEST_LEADER_EXITS"

const leaderOutlived = 1500 * time.Millisecond

func init() {
	if os.Getenv(leaderExitsEnv) == "" {
		return
	}
	runtime.LockOSThread() // init runs on the main thread: keep this goroutine there
	go func() {
		time.Sleep(leaderOutlived)
		os.Exit(0)
	}()
	syscall.RawSyscall(syscall.SYS_EXIT, 0, 0, 0) // this thread only, not the group
}

// A zombie main thread is not a gone process while its other threads run: WaitGone
// waits for them too, or a new server started at once finds the old one's files still
// locked.
func TestWaitGoneWaitsForEveryThread(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), leaderExitsEnv+"=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	// Wait for the main thread to have exited.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		stat, err := os.ReadFile("/proc/" + itoa(pid) + "/stat")
		if err != nil {
			t.Fatalf("the child ended before its main thread was seen a zombie: %v", err)
		}
		if childproc.IsZombie(stat) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the child's main thread never exited")
		}
	}
	if err := childproc.WaitGone(pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadDir("/proc/" + itoa(pid) + "/task")
	if err == nil && len(tasks) > 1 {
		t.Fatalf("WaitGone returned with %d threads of pid %d still running", len(tasks)-1, pid)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
