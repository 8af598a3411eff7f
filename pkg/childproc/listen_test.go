package childproc

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestListensRefusesAnotherProgramsAnswer: a probe answered on the server's port counts
// only when the server's own processes listen there.
func TestListensRefusesAnotherProgramsAnswer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port

	t.Run("held by this test, not the server", func(t *testing.T) {
		r := shRecipe(t.TempDir(), `touch "$1"; exec sleep 60`)
		r.Listens = func() []int { return []int{port} }
		r.StartTimeout = 500 * time.Millisecond
		d := NewDaemon(r, nil)
		err := d.Start(context.Background())
		if err == nil {
			d.Kill()
			t.Fatal("ready on a port only another process listens on")
		}
		if !strings.Contains(err.Error(), "does not listen on it") {
			t.Fatalf("error does not say why: %v", err)
		}
	})
	t.Run("held by the server", func(t *testing.T) {
		f, err := l.(*net.TCPListener).File() // the child inherits the listening socket
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		r := shRecipe(t.TempDir(), `touch "$1"; exec sleep 60`)
		command := r.Command
		r.Command = func() (*exec.Cmd, error) {
			cmd, err := command()
			if err == nil {
				cmd.ExtraFiles = append(cmd.ExtraFiles, f)
			}
			return cmd, err
		}
		r.Listens = func() []int { return []int{port} }
		d := NewDaemon(r, nil)
		if err := d.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		d.Kill()
	})
}

func TestListenersParsesProcNetTCP(t *testing.T) {
	table := []byte(`  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F91 0100007F:A000 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:1F92 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 0 1 0000000000000000 100 0 0 10 0
`)
	got := listeners(table)
	if len(got) != 1 || len(got[8080]) != 1 || got[8080][0] != 4242 {
		t.Fatalf("listeners = %v, want port 8080 with inode 4242 only (an established socket and one without an inode left out)", got)
	}
}
