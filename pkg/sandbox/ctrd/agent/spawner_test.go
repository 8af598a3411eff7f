//go:build linux

package agent

import (
	"os"
	"strings"
	"syscall"
	"testing"
)

// TestSpawnerThreadStartsCommands: with the spawner running, commands are forked from the
// thread named SpawnerThreadName (a child inherits the cgroups of the thread that forked
// it), and no other thread of the process has that name.
func TestSpawnerThreadStartsCommands(t *testing.T) {
	before := namedThreads(t)
	s := NewServer()
	ready := make(chan error, 1)
	s.spawn = make(chan func())
	go s.spawner(ready)
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	if n := namedThreads(t); n != before+1 {
		t.Fatalf("%d threads named %s after a spawner started, %d before; want one more", n, SpawnerThreadName, before)
	}
	// Every function the spawner runs, the fork included, runs on that one thread.
	var tids []int
	for range 3 {
		s.spawn <- func() { tids = append(tids, syscall.Gettid()) }
		done := make(chan syscall.WaitStatus, 1)
		pid, err := s.fork("/bin/true", []string{"true"}, &syscall.ProcAttr{Files: []uintptr{0, 1, 2}}, done)
		if err != nil {
			t.Fatal(err)
		}
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, tid := range tids {
		b, err := os.ReadFile("/proc/self/task/" + itoa(tid) + "/comm")
		if err != nil || strings.TrimSpace(string(b)) != SpawnerThreadName || tid != tids[0] {
			t.Fatalf("the spawner's functions ran on threads %v; thread %d is named %q (%v), want %s", tids, tid, b, err, SpawnerThreadName)
		}
	}
}

// namedThreads counts the threads of this process named SpawnerThreadName.
func namedThreads(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		b, _ := os.ReadFile("/proc/self/task/" + e.Name() + "/comm")
		if strings.TrimSpace(string(b)) == SpawnerThreadName {
			n++
		}
	}
	return n
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// BenchmarkFork is what starting a command from the spawner thread costs over forking
// from whatever thread runs the request: the hand-over to a locked thread and back.
func BenchmarkFork(b *testing.B) {
	attr := &syscall.ProcAttr{Files: []uintptr{0, 1, 2}}
	run := func(b *testing.B, s *Server) {
		for b.Loop() {
			done := make(chan syscall.WaitStatus, 1)
			pid, err := s.fork("/bin/true", []string{"true"}, attr, done)
			if err != nil {
				b.Fatal(err)
			}
			var ws syscall.WaitStatus
			if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("inline", func(b *testing.B) { run(b, NewServer()) })
	b.Run("spawner", func(b *testing.B) {
		s := NewServer()
		ready := make(chan error, 1)
		s.spawn = make(chan func())
		go s.spawner(ready)
		if err := <-ready; err != nil {
			b.Fatal(err)
		}
		run(b, s)
	})
}

// BenchmarkSpawnerHandoff is the hand-over alone: a function run on the spawner thread
// and waited for, as fork does.
func BenchmarkSpawnerHandoff(b *testing.B) {
	s := NewServer()
	ready := make(chan error, 1)
	s.spawn = make(chan func())
	go s.spawner(ready)
	if err := <-ready; err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		finished := make(chan struct{})
		s.spawn <- func() { close(finished) }
		<-finished
	}
}
