// Command abuse tries what a hostile agent would inside a sandbox; the abuse tests
// copy it into a sandbox's workspace and expect every attempt to fail.
//
//	abuse ptrace PID     attach to PID with ptrace
//	abuse procmem PID    open PID's memory through /proc for reading
//	abuse sendto IP:PORT send a UDP datagram to IP:PORT with sendto
package main

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"syscall"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: abuse ptrace|procmem PID")
		os.Exit(2)
	}
	if os.Args[1] == "sendto" {
		report(sendto(os.Args[2]))
		return
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
	report(err)
}

func report(err error) {
	if err != nil {
		fmt.Println("refused:", err)
		os.Exit(1)
	}
	fmt.Println("allowed")
}

func sendto(dst string) error {
	ap, err := netip.ParseAddrPort(dst)
	if err != nil || !ap.Addr().Is4() {
		fmt.Fprintln(os.Stderr, "want IPv4:PORT:", dst)
		os.Exit(2)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	return syscall.Sendto(fd, []byte("x"), 0, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()})
}
