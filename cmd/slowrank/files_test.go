package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slowrank/slowrank/otel/export"
)

// A FIFO planted at --output, --facts or --verdicts is refused at once
// (exit 2), not opened and waited on.
func TestOutputsRefuseAFIFO(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "planted")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	if _, _, err := createOutput(fifo); !errors.Is(err, export.ErrNotRegular) {
		t.Errorf("createOutput: %v, want ErrNotRegular", err)
	}
	for _, args := range [][]string{
		{"simulate", "--duration", "1s", "--output", fifo},
		{"aggregate", "--listen", "127.0.0.1:0", "--duration", "100ms", "--facts", fifo},
		{"aggregate", "--listen", "127.0.0.1:0", "--duration", "100ms", "--verdicts", fifo},
	} {
		done := make(chan int, 1)
		go func() { _, code := runErr(t, nil, args...); done <- code }()
		select {
		case code := <-done:
			if code != exitUsage {
				t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%v blocked on the FIFO", args)
		}
	}
}

func TestSIGHUPReopensTheOutputs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "verdicts.jsonl")
	w, err := export.NewJSONLWriter(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := w.Close(); err != nil {
			t.Error(err)
		}
	}()
	stop := reopenOnHangup(w, nil)
	defer stop()
	w.Write(1)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.Reopened() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	w.Write(2)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || strings.TrimSpace(string(b)) != "2" {
		t.Fatalf("after SIGHUP the new file holds %q (%v), want 2", b, err)
	}
}
