package main

import (
	"sync"
	"testing"
)

// A client reading stack.json while gauntlet up writes it sees the whole file or none:
// never a truncated one ("unexpected end of JSON input", as a test once read).
func TestStackFileIsNeverReadHalfWritten(t *testing.T) {
	dir := t.TempDir()
	s := stack{NATSURL: "nats://127.0.0.1:4222", ClickHouse: "127.0.0.1:9000", Database: "gauntlet"}
	if err := writeStack(dir, s); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := writeStack(dir, s); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range 2000 {
		if _, err := readStack(dir); err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("read while written: %v", err)
		}
	}
	close(stop)
	wg.Wait()
}
