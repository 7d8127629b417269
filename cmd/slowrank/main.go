// Command slowrank finds the slow rank of a distributed GPU training job
// without changes to the training code. See README.md.
package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

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
			webhookCommand(),
		},
		// main prints errors and picks the exit code; never exit inside Run.
		ExitErrHandler: func(*cli.Context, error) {},
		OnUsageError:   usageError,
		// Reached without a command or with an unknown one (cli's own
		// answer is the help and exit 0, or exit 3).
		Action: missingCommand,
	}
	for _, c := range app.Commands {
		if configurable[c.Name] {
			withConfigFile(c) // config.go
		}
		strictUsage(c)
	}
	return app
}

// strictUsage makes every usage error of c and its subcommands one line and
// exit 2: bad flag values, a missing or unknown subcommand, and arguments
// where none are taken (a flag after such an argument would be ignored).
func strictUsage(c *cli.Command) {
	c.OnUsageError = usageError
	if len(c.Subcommands) > 0 {
		if c.Action == nil {
			c.Action = missingCommand
		}
		for _, sub := range c.Subcommands {
			strictUsage(sub)
		}
		return
	}
	if c.ArgsUsage != "" || c.Action == nil {
		return
	}
	action := c.Action
	c.Action = func(ctx *cli.Context) error {
		if ctx.Args().Present() {
			return cli.Exit(fmt.Sprintf("%s: unexpected argument %q (flags go before arguments; see --help)",
				ctx.Command.FullName(), ctx.Args().First()), exitUsage)
		}
		return action(ctx)
	}
}

// missingCommand answers a command run without one of its subcommands, or
// with an unknown one.
func missingCommand(c *cli.Context) error {
	name := "slowrank"
	var subs []*cli.Command
	if c.Command != nil && c.Command.Name != "" && c.Command.Name != c.App.Name {
		name, subs = c.Command.FullName(), c.Command.Subcommands
	} else {
		subs = c.App.Commands
	}
	var names []string
	for _, s := range subs {
		if !s.Hidden && s.Name != "help" {
			names = append(names, s.Name)
		}
	}
	if c.Args().Present() {
		return cli.Exit(fmt.Sprintf("%s: unknown command %q (want one of %s; see --help)", name, c.Args().First(), strings.Join(names, ", ")), exitUsage)
	}
	return cli.Exit(fmt.Sprintf("%s: a command is required (one of %s; see --help)", name, strings.Join(names, ", ")), exitUsage)
}

// usageError turns a flag parsing error into a one-line message and exit 2.
func usageError(c *cli.Context, err error, _ bool) error {
	return cli.Exit(fmt.Sprintf("%s: %v (see --help)", c.Command.FullName(), err), exitUsage)
}
