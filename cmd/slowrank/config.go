package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/urfave/cli/v2"
	"gopkg.in/yaml.v3"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/agent/privilege"
)

// Configuration files (--config FILE). A file is YAML or JSON (JSON is read
// as YAML). Its top-level keys are flag names of the command being run, or a
// command name whose mapping holds that command's flags, so that one file
// serves every command:
//
//	window: 5s            # the command's own --window
//	agent:                # only for `slowrank agent`
//	  facts: /var/lib/slowrank/facts.jsonl
//	  pid: [4242, 4243]   # repeatable flags take lists
//	replay:
//	  threshold: 0.05
//
// Values are what the flag takes on the command line. Precedence: flag >
// environment > file > default. Every key must name a flag of its command
// (unknown keys, duplicates, nested mappings and a top-level value that is
// not a mapping are errors naming the file, line and key).

// configurable lists the commands that take --config.
var configurable = map[string]bool{"agent": true, "replay": true, "aggregate": true}

// maxConfigSize bounds a configuration file.
const maxConfigSize = 1 << 20

func configFlag() cli.Flag {
	return &cli.StringFlag{Name: "config", Usage: "read flags from this YAML or JSON file (flag > env > file > default)", EnvVars: []string{"SLOWRANK_CONFIG"}}
}

// withConfigFile gives cmd a --config flag applied before its action.
func withConfigFile(cmd *cli.Command) {
	cmd.Flags = append(cmd.Flags, configFlag())
	prev := cmd.Before
	cmd.Before = func(c *cli.Context) error {
		if err := applyConfigFile(c); err != nil {
			return err
		}
		if prev != nil {
			return prev(c)
		}
		return nil
	}
}

// configEntry is one flag setting read from a file.
type configEntry struct {
	section string // command name, "" for top level
	key     string
	values  []string // one per repetition of the flag
	line    int
}

// configError says what is wrong and where.
type configError struct {
	line int
	key  string
	msg  string
}

func (e *configError) Error() string {
	var b strings.Builder
	if e.line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.line)
	}
	if e.key != "" {
		key := e.key
		if strings.IndexFunc(key, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
			key = strconv.Quote(key) // keep the error on one line
		}
		fmt.Fprintf(&b, "%s: ", key)
	}
	b.WriteString(e.msg)
	return b.String()
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parseConfig parses a configuration file. sections reports whether a
// top-level key names a command (whose value is then a mapping of flags).
func parseConfig(data []byte, sections func(string) bool) ([]configEntry, error) {
	if len(data) > maxConfigSize {
		return nil, &configError{msg: fmt.Sprintf("file larger than %d bytes", maxConfigSize)}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		msg := strings.ReplaceAll(err.Error(), "\n", "; ")
		if m := yamlLine.FindStringSubmatch(msg); m != nil {
			n, _ := strconv.Atoi(m[1])
			return nil, &configError{line: n, msg: "invalid YAML/JSON: " + m[2]}
		}
		return nil, &configError{msg: "invalid YAML/JSON: " + strings.TrimPrefix(msg, "yaml: ")}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, nil // empty file
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, &configError{line: root.Line, msg: "the file must hold a mapping of flag names to values"}
	}
	var out []configEntry
	seen := map[string]int{}
	var walk func(m *yaml.Node, section string) error
	walk = func(m *yaml.Node, section string) error {
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return &configError{line: k.Line, msg: "keys must be flag names"}
			}
			name := k.Value
			full := name
			if section != "" {
				full = section + "." + name
			}
			if prev, dup := seen[full]; dup {
				return &configError{line: k.Line, key: full, msg: fmt.Sprintf("duplicate key (first on line %d)", prev)}
			}
			seen[full] = k.Line
			if section == "" && sections(name) {
				if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
					continue // an empty section
				}
				if v.Kind != yaml.MappingNode {
					return &configError{line: v.Line, key: full, msg: "a command section must be a mapping of its flags"}
				}
				if err := walk(v, name); err != nil {
					return err
				}
				continue
			}
			e := configEntry{section: section, key: name, line: k.Line}
			switch v.Kind {
			case yaml.ScalarNode:
				if v.Tag == "!!null" {
					return &configError{line: v.Line, key: full, msg: "missing value"}
				}
				e.values = []string{v.Value}
			case yaml.SequenceNode:
				if len(v.Content) == 0 {
					// An empty list would set nothing yet look like it
					// clears the flag: say so rather than keep the default.
					return &configError{line: v.Line, key: full, msg: "empty list: it sets nothing; remove the key to keep the default"}
				}
				for _, it := range v.Content {
					if it.Kind != yaml.ScalarNode || it.Tag == "!!null" {
						return &configError{line: it.Line, key: full, msg: "list items must be plain values"}
					}
					e.values = append(e.values, it.Value)
				}
			case yaml.AliasNode:
				return &configError{line: v.Line, key: full, msg: "YAML aliases are not supported"}
			default:
				return &configError{line: v.Line, key: full, msg: "value must be a plain value or a list of them"}
			}
			out = append(out, e)
		}
		return nil
	}
	if err := walk(root, ""); err != nil {
		return nil, err
	}
	return out, nil
}

// flagSpec is what the file may set for one command.
type flagSpec struct {
	names map[string]cli.Flag // every name and alias
	list  []string            // primary names, sorted
}

func specOf(cmd *cli.Command) flagSpec {
	s := flagSpec{names: map[string]cli.Flag{}}
	for _, f := range cmd.Flags {
		ns := f.Names()
		if len(ns) == 0 || ns[0] == "config" || ns[0] == "help" {
			continue
		}
		for _, n := range ns {
			s.names[n] = f
		}
		s.list = append(s.list, ns[0])
	}
	sort.Strings(s.list)
	return s
}

// isMulti reports whether f may be given more than once.
func isMulti(f cli.Flag) bool {
	switch f.(type) {
	case *cli.IntSliceFlag, *cli.StringSliceFlag, *cli.Int64SliceFlag, *cli.Float64SliceFlag, *cli.UintSliceFlag, *cli.Uint64SliceFlag:
		return true
	}
	return false
}

// checkEntries validates entries against the commands' flags (cmds by name).
func checkEntries(entries []configEntry, current string, cmds map[string]flagSpec) error {
	for _, e := range entries {
		section := e.section
		if section == "" {
			section = current
		}
		spec, ok := cmds[section]
		full := e.key
		if e.section != "" {
			full = e.section + "." + e.key
		}
		if !ok {
			return &configError{line: e.line, key: full, msg: fmt.Sprintf("unknown command %q", section)}
		}
		f, ok := spec.names[e.key]
		if !ok {
			msg := fmt.Sprintf("unknown key: %s has no flag --%s", section, e.key)
			if s := closest(e.key, spec.list); s != "" {
				msg += fmt.Sprintf(" (did you mean %s?)", s)
			}
			return &configError{line: e.line, key: full, msg: msg}
		}
		if len(e.values) != 1 && !isMulti(f) {
			return &configError{line: e.line, key: full, msg: "takes one value, not a list"}
		}
	}
	return nil
}

// closest returns the candidate nearest to s (edit distance <= 2), if any.
func closest(s string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		if d := editDistance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// applyConfigFile sets, from --config, every flag of the running command
// that neither the command line nor the environment set.
func applyConfigFile(c *cli.Context) error {
	path := c.String("config")
	if path == "" {
		return nil
	}
	fail := func(err error) error {
		return cli.Exit(fmt.Sprintf("--config %s: %v", path, err), exitUsage)
	}
	data, err := readConfig(path)
	if err != nil {
		return fail(err)
	}
	cmds := map[string]flagSpec{}
	if c.App != nil {
		for _, cmd := range c.App.Commands {
			if configurable[cmd.Name] {
				cmds[cmd.Name] = specOf(cmd)
			}
		}
	}
	current := c.Command.Name
	cmds[current] = specOf(c.Command)
	entries, err := parseConfig(data, func(s string) bool { _, ok := cmds[s]; return ok })
	if err != nil {
		return fail(fileErr(path, err))
	}
	if err := checkEntries(entries, current, cmds); err != nil {
		return fail(fileErr(path, err))
	}
	// Top-level keys first, then this command's section (more specific).
	slices.SortStableFunc(entries, func(a, b configEntry) int {
		return boolInt(a.section != "") - boolInt(b.section != "")
	})
	applied := map[string]bool{}
	for _, e := range entries {
		if e.section != "" && e.section != current {
			continue
		}
		f := cmds[current].names[e.key]
		name := f.Names()[0]
		if c.IsSet(name) && !applied[name] {
			continue // flag or environment wins
		}
		if applied[name] {
			// The section overrides a top-level value: start over.
			if err := resetFlag(c, f); err != nil {
				return fail(fileErr(path, &configError{line: e.line, key: e.key, msg: err.Error()}))
			}
		}
		for _, v := range e.values {
			if err := c.Set(name, v); err != nil {
				return fail(fileErr(path, &configError{line: e.line, key: keyOf(e), msg: fmt.Sprintf("invalid value %q: %v", v, unwrapSetErr(err))}))
			}
		}
		applied[name] = true
	}
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func keyOf(e configEntry) string {
	if e.section != "" {
		return e.section + "." + e.key
	}
	return e.key
}

// resetFlag clears a repeatable flag that the file set twice (top level and
// section); single-value flags are simply set again.
func resetFlag(c *cli.Context, f cli.Flag) error {
	if !isMulti(f) {
		return nil
	}
	return errors.New("set both at the top level and in the command's section")
}

func unwrapSetErr(err error) error {
	var ne *strconv.NumError
	if errors.As(err, &ne) {
		return ne.Err
	}
	return err
}

// fileErr puts the file name in front of a configError's line.
func fileErr(path string, err error) error {
	var ce *configError
	if errors.As(err, &ce) && ce.line > 0 {
		rest := *ce
		rest.line = 0
		return fmt.Errorf("line %d: %s", ce.line, rest.Error())
	}
	return err
}

// readConfig reads at most maxConfigSize bytes of a regular file.
func readConfig(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return nil, pe.Err
		}
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		return nil, errors.New("is a directory")
	}
	data, err := io.ReadAll(io.LimitReader(f, maxConfigSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxConfigSize {
		return nil, fmt.Errorf("file larger than %d bytes", maxConfigSize)
	}
	return data, nil
}

// parseSize parses a byte size: a number with an optional K, M, G (powers of
// 1024, optionally followed by "i", "iB" or "B").
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	up := strings.ToUpper(t)
	for _, suf := range []struct {
		s string
		m int64
	}{{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"KI", 1 << 10}, {"MI", 1 << 20}, {"GI", 1 << 30},
		{"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(up, suf.s) {
			t, mult = strings.TrimSpace(t[:len(t)-len(suf.s)]), suf.m
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<50)/mult {
		return 0, fmt.Errorf("invalid size %q (want e.g. 512MiB, 2G or a number of bytes)", s)
	}
	return n * mult, nil
}

// reliabilityFlags are the agent's resource and privilege flags.
func reliabilityFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "max-memory", Value: "512MiB", Usage: "bound of the agent's resident memory (sets the Go memory limit; 0: none)", EnvVars: []string{"SLOWRANK_MAX_MEMORY"}},
		&cli.StringFlag{Name: "state-dir", Value: "/var/lib/slowrank", Usage: "directory for state kept across restarts (the attach epoch); empty: none", EnvVars: []string{"SLOWRANK_STATE_DIR"}},
		&cli.IntFlag{Name: "max-procs", Value: 1, Usage: "CPUs the agent may run Go code on at once (GOMAXPROCS; 0: all). One is cheapest per event", EnvVars: []string{"SLOWRANK_MAX_PROCS"}},
		&cli.BoolFlag{Name: "drop-capabilities", Value: true, Usage: "at start, drop every capability the agent does not need (re-executes itself as root)", EnvVars: []string{"SLOWRANK_DROP_CAPABILITIES"}},
	}
}

// reliabilityConfig validates the reliability flags into cfg (no I/O).
func reliabilityConfig(c *cli.Context, cfg *agent.Config) error {
	mem, err := parseSize(c.String("max-memory"))
	if err != nil {
		return cli.Exit("--max-memory: "+err.Error(), exitUsage)
	}
	if rb := cfg.RingBufferSize; rb < 4096 || rb&(rb-1) != 0 {
		return cli.Exit(fmt.Sprintf("--ringbuf-size must be a power of two of at least 4096, got %d", rb), exitUsage)
	}
	if mem > 0 {
		if _, err := agent.GoMemoryLimit(mem, cfg.RingBufferSize); err != nil {
			return cli.Exit("--max-memory: "+err.Error(), exitUsage)
		}
	}
	cfg.MaxMemory = mem
	switch n := c.Int("max-procs"); {
	case n < 0:
		return cli.Exit(fmt.Sprintf("--max-procs must be 0 (all CPUs) or positive, got %d", n), exitUsage)
	case n > 0:
		// One P: the reader and the pipeline hand batches over without
		// waking a second thread; 0.55 us per event instead of 0.75.
		runtime.GOMAXPROCS(n)
	}
	return nil
}

// secureAgent checks the capabilities the agent needs (refusing to start
// without a required one), drops the others (re-executing the process) and
// then takes the attach epoch from the state directory. A stop signal
// already caught (on sig) returns errStoppedWhileStarting instead of the
// re-execution, which would forget it.
func secureAgent(sig <-chan os.Signal, c *cli.Context, cfg *agent.Config, log *slog.Logger) error {
	chk, err := privilege.CheckCapabilities(cfg.DeviceCollection)
	if err != nil {
		if errors.Is(err, privilege.ErrMissingCapability) {
			return cli.Exit(err.Error(), 1)
		}
		log.Warn("cannot check capabilities", "err", err)
	} else {
		if chk.IgnoredMark {
			log.Warn("ignoring "+privilege.CapsDroppedEnv+" from the environment: this process still holds the capabilities that the drop removes", "value", os.Getenv(privilege.CapsDroppedEnv))
		}
		for _, m := range chk.Missing {
			log.Warn("capability missing: a feature will not work", "capability", m.Cap.String(), "needed_to", m.Why)
		}
		if c.Bool("drop-capabilities") {
			select {
			case <-sig:
				return errStoppedWhileStarting
			default:
			}
			if err := privilege.DropCapabilities(chk); err != nil {
				log.Warn("capabilities not dropped", "err", err)
			} else {
				log.Info("capabilities limited to what the agent needs", "kept", chk.Keep.String())
			}
		}
	}
	epoch, err := agent.NextEpoch(c.String("state-dir"), time.Now())
	if err != nil {
		log.Warn("attach epoch not persisted: a restart within the same second may reuse it", "err", err)
	}
	cfg.Epoch = epoch
	return nil
}

// logCounters logs the agent's counters in one line (at stop), with the
// final counts of the sinks that count their losses (after they closed).
func logCounters(log *slog.Logger, counters map[string]int64, sinks []agent.Sink) {
	for _, s := range sinks {
		if cs, ok := s.(agent.CounterSource); ok {
			for k, v := range cs.Counters() {
				counters[k] = v
			}
		}
	}
	keys := make([]string, 0, len(counters))
	for k := range counters {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	args := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		args = append(args, k, counters[k])
	}
	log.Info("counters", args...)
}
