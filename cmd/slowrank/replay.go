package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/slowrank/slowrank/detector"
)

func replayCommand() *cli.Command {
	return &cli.Command{
		Name:      "replay",
		Usage:     "judge a file of step facts and write verdicts (deterministic)",
		UsageText: "slowrank replay --input FACTS.jsonl [--output VERDICTS.jsonl] [--window 5s] [--threshold 0.05] [--floor 1ms] [--consecutive 3]",
		Description: "Reads step and topology facts (JSONL, DESIGN.md 5.1) from a file or stdin ('-'),\n" +
			"runs the detector and writes one verdict per non-ok (window, rank, phase) and a final\n" +
			"summary per job (JSONL, DESIGN.md 5.2). Identical input gives byte-identical output.\n" +
			"A malformed line stops the replay with exit code 2 and its line number, unless\n" +
			"--skip-invalid is given; then it is counted in the summary.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "input", Aliases: []string{"i"}, Value: "-", Usage: "facts file, '-' for stdin", EnvVars: []string{"SLOWRANK_INPUT"}},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "-", Usage: "verdicts file, '-' for stdout", EnvVars: []string{"SLOWRANK_OUTPUT"}},
			&cli.BoolFlag{Name: "skip-invalid", Usage: "count and skip malformed lines instead of failing", EnvVars: []string{"SLOWRANK_SKIP_INVALID"}},
			&cli.BoolFlag{Name: "report", Usage: "print a readable report of who is slow to stderr", EnvVars: []string{"SLOWRANK_REPORT"}},
		}, detectorFlags()...),
		Action: func(c *cli.Context) error {
			cfg, err := detectorConfig(c)
			if err != nil {
				return err
			}
			in, closeIn, err := openInput(c.String("input"))
			if err != nil {
				return cli.Exit(err.Error(), exitUsage)
			}
			defer closeIn()
			out, closeOut, err := createOutput(c.String("output"))
			if err != nil {
				return cli.Exit(err.Error(), exitUsage)
			}
			res, err := replay(in, out, cfg, c.Bool("skip-invalid"))
			if cerr := closeOut(); err == nil && cerr != nil {
				err = fmt.Errorf("write %s: %w", c.String("output"), cerr)
			}
			if err != nil {
				var ie *inputError
				if errors.As(err, &ie) {
					return cli.Exit(fmt.Sprintf("%s: %v", c.String("input"), err), exitUsage)
				}
				return err
			}
			if c.Bool("report") {
				var b bytes.Buffer
				writeReport(&b, res, cfg)
				fmt.Fprint(os.Stderr, b.String()) // stderr: there is no place left to report its failure
			}
			return nil
		},
	}
}

// inputError is a problem with the facts, as opposed to an I/O failure.
type inputError struct {
	line int
	err  error
}

func (e *inputError) Error() string { return fmt.Sprintf("line %d: %v", e.line, e.err) }
func (e *inputError) Unwrap() error { return e.err }

// replayResult is what a replay saw, for the report.
type replayResult struct {
	verdicts  []detector.Verdict
	summaries []detector.Summary
}

// replay reads all facts, orders steps by end time (so that the order of
// facts in the input never matters), judges them and writes verdicts then
// summaries.
func replay(in io.Reader, out io.Writer, cfg detector.Config, skipInvalid bool) (*replayResult, error) {
	facts, err := readFacts(in, skipInvalid)
	if err != nil {
		return nil, err
	}
	d, err := detector.New(cfg)
	if err != nil {
		return nil, err
	}
	for _, job := range facts.jobs() {
		d.SetOrigin(job, facts.origin[job])
	}
	for _, t := range facts.topologies {
		if err := d.AddTopology(t); err != nil {
			return nil, err
		}
	}
	w := bufio.NewWriterSize(out, 1<<16)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	res := &replayResult{}
	emit := func(vs []detector.Verdict) error {
		for _, v := range vs {
			if err := enc.Encode(v); err != nil {
				return err
			}
		}
		res.verdicts = append(res.verdicts, vs...)
		return nil
	}
	for _, s := range facts.steps {
		vs, err := d.AddStep(s)
		if err != nil {
			return nil, err
		}
		if err := emit(vs); err != nil {
			return nil, err
		}
	}
	if err := emit(d.Flush()); err != nil {
		return nil, err
	}
	res.summaries = d.Summaries()
	if len(res.summaries) == 0 {
		res.summaries = []detector.Summary{{Kind: detector.KindSummary, Stragglers: []int{}}}
	}
	for i := range res.summaries {
		res.summaries[i].InvalidLines = facts.invalid
		res.summaries[i].UnknownKinds = facts.unknown
		if err := enc.Encode(res.summaries[i]); err != nil {
			return nil, err
		}
	}
	return res, w.Flush()
}

type factSet struct {
	steps      []detector.Step
	topologies []detector.Topology
	origin     map[string]int64
	invalid    int64
	unknown    int64
}

func (f *factSet) jobs() []string {
	jobs := make([]string, 0, len(f.origin))
	for j := range f.origin {
		jobs = append(jobs, j)
	}
	slices.Sort(jobs)
	return jobs
}

func readFacts(in io.Reader, skipInvalid bool) (*factSet, error) {
	f := &factSet{origin: map[string]int64{}}
	r := bufio.NewReaderSize(in, 1<<16)
	for n := 1; ; n++ {
		line, err := readLine(r, maxFactLine, skipInvalid)
		if errors.Is(err, errLineTooLong) {
			if !skipInvalid {
				return nil, &inputError{line: n, err: err}
			}
			f.invalid++
			continue
		}
		if len(line) > 0 {
			if perr := f.add(line); perr != nil {
				switch {
				case errors.Is(perr, detector.ErrUnknownKind):
					f.unknown++
				case skipInvalid:
					f.invalid++
				default:
					return nil, &inputError{line: n, err: perr}
				}
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read facts: %w", err)
		}
	}
	sort.SliceStable(f.steps, func(a, b int) bool { return stepLess(&f.steps[a], &f.steps[b]) })
	sort.SliceStable(f.topologies, func(a, b int) bool {
		ta, tb := &f.topologies[a], &f.topologies[b]
		if ta.Job != tb.Job {
			return ta.Job < tb.Job
		}
		return ta.Version < tb.Version
	})
	return f, nil
}

// maxFactLine bounds one line of facts: a topology of 100,000 ranks is
// about 6 MB. Without it, an input without newlines (/dev/zero) grows
// without bound.
const maxFactLine = 16 << 20

var errLineTooLong = fmt.Errorf("line longer than %d MiB", maxFactLine>>20)

// readLine returns the next line (with its newline, if any) of at most max
// bytes. A longer one is errLineTooLong; with skipLong it has been read to
// its end, else only its first max bytes.
func readLine(r *bufio.Reader, max int, skipLong bool) ([]byte, error) {
	var line []byte
	long := false
	for {
		chunk, err := r.ReadSlice('\n')
		if !long && len(line)+len(chunk) > max {
			if !skipLong {
				return nil, errLineTooLong
			}
			long, line = true, nil
		}
		if !long {
			line = append(line, chunk...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if long && (err == nil || errors.Is(err, io.EOF)) {
			err = errLineTooLong
		}
		return line, err
	}
}

func (f *factSet) add(line []byte) error {
	trimmed := strings.TrimSpace(string(line))
	if trimmed == "" {
		return nil
	}
	fact, err := detector.DecodeFact([]byte(trimmed))
	if err != nil {
		return err
	}
	switch v := fact.(type) {
	case *detector.Step:
		f.steps = append(f.steps, *v)
		if o, ok := f.origin[v.Job]; !ok || v.EndNS < o {
			f.origin[v.Job] = v.EndNS
		}
	case *detector.Topology:
		f.topologies = append(f.topologies, *v)
	}
	return nil
}

// stepLess orders steps by end time, then by identity, so that replays do not
// depend on the order of facts in the input.
func stepLess(a, b *detector.Step) bool {
	switch {
	case a.EndNS != b.EndNS:
		return a.EndNS < b.EndNS
	case a.Job != b.Job:
		return a.Job < b.Job
	case a.Rank != b.Rank:
		return a.Rank < b.Rank
	case a.Epoch != b.Epoch:
		return a.Epoch < b.Epoch
	default:
		return a.Step < b.Step
	}
}

func openInput(path string) (io.Reader, func(), error) {
	if path == "-" || path == "" {
		return os.Stdin, func() {}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("open facts: %w", err)
	}
	// A directory opens but cannot be read: say so now, a usage error,
	// not a read failure later. Pipes and devices are fine.
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		_ = f.Close() // read only
		return nil, nil, fmt.Errorf("open facts: %s is a directory, want a JSONL file or - for stdin", path)
	}
	return f, func() { _ = f.Close() }, nil // read only
}

// createOutput creates path for writing (0640, never through a symlink); "-"
// is stdout, and a character device such as /dev/null is written as it is.
func createOutput(path string) (io.Writer, func() error, error) {
	if path == "-" || path == "" {
		return os.Stdout, func() error { return nil }, nil
	}
	f, err := openCharDevice(path)
	if err == nil && f == nil {
		f, err = createFile(path)
	}
	if err != nil {
		return nil, nil, err
	}
	return f, f.Close, nil
}

// openCharDevice opens path for writing when it is a character device
// (/dev/null, a terminal), which createFile refuses as not a regular file;
// it returns nil and no error for anything else. The open follows no
// symlink at the last component, creates nothing, and the device is checked
// again on the open file, so a path swapped in between is refused.
func openCharDevice(path string) (*os.File, error) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NOFOLLOW|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if fi, err := f.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		_ = f.Close() // nothing written: the check's error is the one to return
		return nil, fmt.Errorf("open %s: no longer a character device", path)
	}
	return f, nil
}
