package svcnet

import (
	"errors"
	"sync/atomic"
	"testing"
)

// handWriter is an upstream that has the bytes once Write is called (the host may answer
// and close at once) but returns only when released.
type handWriter struct {
	got     chan int
	release chan struct{}
	fail    bool
}

func (w handWriter) Write(b []byte) (int, error) {
	w.got <- len(b)
	<-w.release
	if w.fail {
		return 3, errors.New("broken pipe")
	}
	return len(b), nil
}

// TestCountWriterCountsBeforeTheBytesLeave: a plain TCP connection is recorded when the
// host ends its side, which it may do as soon as it has the sandbox's bytes, before the
// relay's Write to it returns. The count of bytes sent up must already hold them then
// (a CI run recorded 0 of 11 bytes up); a failed write takes back what it did not send.
func TestCountWriterCountsBeforeTheBytesLeave(t *testing.T) {
	for _, fail := range []bool{false, true} {
		var n atomic.Int64
		w := handWriter{got: make(chan int), release: make(chan struct{}), fail: fail}
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = countWriter{w, &n}.Write(make([]byte, 11))
		}()
		<-w.got
		if got := n.Load(); got != 11 {
			t.Errorf("fail=%v: %d bytes counted while the host has 11", fail, got)
		}
		close(w.release)
		<-done
		want := int64(11)
		if fail {
			want = 3
		}
		if got := n.Load(); got != want {
			t.Errorf("fail=%v: %d bytes counted after the write, want %d", fail, got, want)
		}
	}
}
