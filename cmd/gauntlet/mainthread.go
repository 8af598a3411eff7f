package main

import "runtime"

// The main goroutine keeps the process's main thread to itself, so no other goroutine
// ever runs there. A goroutine that locks its thread and enters a namespace (a
// container's mounts for the storage faults' FUSE layer, a sandbox's network) takes the
// thread down with it when it ends, except the main thread, which Go keeps, wedged in
// that namespace; and /proc/self, which libraries read for the mount table, is the main
// thread's view. pkg/procfs is the other half of this defence: gauntlet's own mount-table
// reads ask for the calling thread's view.
func init() {
	runtime.LockOSThread()
}
