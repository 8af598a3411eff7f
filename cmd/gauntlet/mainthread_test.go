package main

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// No goroutine but the main one ever runs on the process's main thread (see init in
// mainthread.go): goroutines that lock their thread, as the namespace-switching ones do,
// always get another.
func TestMainThreadIsNeverLent(t *testing.T) {
	const n = 500
	onMain := make(chan bool, n)
	for range n {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			onMain <- unix.Gettid() == unix.Getpid()
		}()
	}
	for range n {
		if <-onMain {
			t.Fatal("a goroutine locked the main thread")
		}
	}
}
