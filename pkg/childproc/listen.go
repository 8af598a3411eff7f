package childproc

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// unheldPorts returns the ports of want on which no process of process group pgid holds
// a listening TCP socket (IPv4 or IPv6), as /proc of this network namespace shows them.
// A server's probe answered on its port proves nothing while another program's server
// may hold that port: see Recipe.Listens.
func unheldPorts(pgid int, want []int) ([]int, error) {
	owned, err := groupSockets(pgid)
	if err != nil {
		return nil, err
	}
	held := make(map[int]bool)
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if os.IsNotExist(err) {
			continue // no IPv6 in this kernel
		}
		if err != nil {
			return nil, fmt.Errorf("listening sockets: %w", err)
		}
		for port, inode := range listeners(b) {
			for _, ino := range inode {
				if owned[ino] {
					held[port] = true
				}
			}
		}
	}
	var out []int
	for _, p := range want {
		if !held[p] {
			out = append(out, p)
		}
	}
	return out, nil
}

// listeners parses a /proc/net/tcp table: the inodes of its listening sockets by local
// port. A line is "sl local_address rem_address st ... inode ...", addresses as
// HEXADDR:HEXPORT and the state 0A for LISTEN.
func listeners(table []byte) map[int][]uint64 {
	out := make(map[int][]uint64)
	sc := bufio.NewScanner(bytes.NewReader(table))
	sc.Scan() // the header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[3] != "0A" {
			continue
		}
		i := strings.LastIndexByte(f[1], ':')
		port, err := strconv.ParseUint(f[1][i+1:], 16, 16)
		if i < 0 || err != nil {
			continue
		}
		inode, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil || inode == 0 {
			continue
		}
		out[int(port)] = append(out[int(port)], inode)
	}
	return out
}

// groupSockets returns the inodes of the sockets open in the processes of group pgid.
// Processes that end or deny access while it reads are skipped.
func groupSockets(pgid int) (map[uint64]bool, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listening sockets: %w", err)
	}
	out := make(map[uint64]bool)
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || processGroup(pid) != pgid {
			continue
		}
		fdDir := filepath.Join("/proc", e.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			if ino, err := strconv.ParseUint(strings.TrimSuffix(link[len("socket:["):], "]"), 10, 64); err == nil {
				out[ino] = true
			}
		}
	}
	return out, nil
}

// processGroup is pid's process group from /proc/pid/stat, -1 when unreadable. The
// fields after the command name (which may hold spaces and parentheses) are state,
// parent and group.
func processGroup(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 {
		return -1
	}
	g, err := strconv.Atoi(f[2])
	if err != nil {
		return -1
	}
	return g
}
