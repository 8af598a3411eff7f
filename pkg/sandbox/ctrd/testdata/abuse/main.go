// Command abuse tries what a hostile agent would inside a sandbox; the abuse tests
// copy it into a sandbox's workspace and expect every attempt to fail.
//
//	abuse ptrace PID     attach to PID with ptrace
//	abuse procmem PID    open PID's memory through /proc for reading
package main

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: abuse ptrace|procmem PID")
		os.Exit(2)
	}
	pid, err := strconv.Atoi(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "ptrace":
		err = syscall.PtraceAttach(pid)
	case "procmem":
		var f *os.File
		f, err = os.Open(fmt.Sprintf("/proc/%d/mem", pid))
		if err == nil {
			f.Close()
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown attempt", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Println("refused:", err)
		os.Exit(1)
	}
	fmt.Println("allowed")
}
