package main

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/slowrank/slowrank/otel/export"
)

// createFile creates or truncates path with mode 0640, refusing a symlink
// planted at path and anything but a regular file (a FIFO would block the
// open or feed another user's reader), as the JSONL outputs do.
func createFile(path string) (*os.File, error) {
	return export.CreateOutput(path)
}

// reopenOnHangup reopens the JSONL file outputs on SIGHUP (log rotation)
// until the returned stop is called. Without a file output SIGHUP keeps its
// default action.
func reopenOnHangup(ws ...*export.JSONLWriter) (stop func()) {
	var files []*export.JSONLWriter
	for _, w := range ws {
		if w != nil {
			files = append(files, w)
		}
	}
	if len(files) == 0 {
		return func() {}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			case <-hup:
				for _, w := range files {
					if err := w.Reopen(); err != nil {
						slog.Warn("SIGHUP: output not reopened; writing on to the open file", "err", err)
					}
				}
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
		<-stopped
	}
}
