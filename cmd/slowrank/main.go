// Command slowrank finds the slow rank of a distributed GPU training job
// without changes to the training code. See README.md.
package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/urfave/cli/v2"
)

// version is set by the linker (-X main.version=...).
var version = "dev"

// exitUsage is the exit code for bad input: invalid flags, files or facts.
const exitUsage = 2

func main() {
	app := newApp()
	if err := app.Run(os.Args); err != nil {
		var ec cli.ExitCoder
		if errors.As(err, &ec) {
			if msg := err.Error(); msg != "" {
				fmt.Fprintln(os.Stderr, "slowrank:", msg)
			}
			os.Exit(ec.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "slowrank:", err)
		os.Exit(1)
	}
}

func newApp() *cli.App {
	app := &cli.App{
		Name:    "slowrank",
		Usage:   "find the slow rank of a distributed GPU training job, live, without code changes",
		Version: version,
		// --slow and --gap values contain commas.
		DisableSliceFlagSeparator: true,
		Description: "slowrank watches unmodified training processes with eBPF uprobes and a CUPTI\n" +
			"injection library, cuts what it sees into per-rank steps and phases, and names the\n" +
			"rank that is persistently slow, in which phase, compared with whom. Every flag can\n" +
			"also be set from the environment variable shown next to it (flag > env > default).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error", EnvVars: []string{"SLOWRANK_LOG_LEVEL"}},
		},
		Before: func(c *cli.Context) error {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(c.String("log-level"))); err != nil {
				return cli.Exit(fmt.Sprintf("--log-level: %v", err), exitUsage)
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})))
			return nil
		},
		Commands: []*cli.Command{
			agentCommand(),
			replayCommand(),
			simulateCommand(),
			aggregateCommand(),
			doctorCommand(),
			statusCommand(),
			topCommand(),
			controlCommand(),
		},
		// main prints errors and picks the exit code; never exit inside Run.
		ExitErrHandler: func(*cli.Context, error) {},
		OnUsageError:   usageError,
	}
	for _, c := range app.Commands {
		c.OnUsageError = usageError
		if configurable[c.Name] {
			withConfigFile(c) // config.go
		}
	}
	return app
}

// usageError turns a flag parsing error into a one-line message and exit 2.
func usageError(c *cli.Context, err error, _ bool) error {
	return cli.Exit(fmt.Sprintf("%s: %v (see --help)", c.Command.FullName(), err), exitUsage)
}
