package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// Exit codes of [Run] and of the fencelock command.
const (
	// ExitOK: the command did what it was asked.
	ExitOK = 0
	// ExitError: the database refused or could not be reached, output could not be written,
	// a terminated backend did not exit, a lock is held by a prepared transaction, or the
	// operator declined at a prompt.
	ExitError = 1
	// ExitUsage: an unknown command or flag, a missing argument, no database URL.
	ExitUsage = 2
	// ExitNotFound: nobody held it: release --advisory found no holder; release --force found
	// no current grant (never granted: nothing changed; a lapsed grant: its holder was fenced
	// out all the same); or release --token named a grant that is not the lease's last one
	// (nothing changed).
	ExitNotFound = 3
	// ExitLockTimeout: release gave up because a transaction (a RunLocked, the holder's
	// guarded transaction, a grant in flight) holds the lease row: --lock-timeout passed, or
	// PostgreSQL broke a deadlock with a holder that fenced before it guarded. Retry.
	ExitLockTimeout = 4
)

// exitError is an error with the exit code it maps to. Errors of other types exit with
// ExitError.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// withCode returns an error that prints as format and exits with code.
func withCode(code int, format string, a ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, a...)}
}

// command is one subcommand: flags registers its own flags on fs and returns the function that
// runs it, which reads the flag values after parsing.
type command struct {
	name     string
	synopsis string // after the command's name, e.g. "--force NAME"
	summary  string
	flags    func(fs *flag.FlagSet) func(ctx context.Context, s *session, args []string) error
}

// commands lists the subcommands, in the order usage shows them.
func commands() []command {
	return []command{
		{"migrate", "", "apply fencelock's migrations and print the schema version", migrateCommand},
		{"locks", "[--name PATTERN]", "list held leases and advisory locks", locksCommand},
		{"watch", "[--name PATTERN] [--interval 1s]", "the locks table, redrawn until q, ctrl-C or SIGTERM", watchCommand},
		{"fences", "[--name PATTERN]", "list fencing high-water marks and the current holder of the same lease", fencesCommand},
		{"release", "--force NAME [--fence RESOURCE]... | --force --advisory NAME|KEY [--yes]",
			"end a lease's grant and fence its holder out, or terminate the holders of an advisory lock", releaseCommand},
		{"ui", "[--listen 127.0.0.1:8080] [--interval 500ms] [--allow-release]",
			"serve the live view in the browser: who holds what, who waits, each name's timeline", uiCommand},
		{"sweep", "[--grace 1h]", "delete lease rows expired, and rate-limit keys idle, longer than the grace period", sweepCommand},
		{"version", "", "print the version of fencelock, the revision it was built from and the Go version", versionCommand},
	}
}

// Run runs the fencelock command with args (without the program name), reading the database
// URL from --database-url or env("DATABASE_URL"), prompts' answers from stdin (and watch's q),
// writing results to stdout and errors, one line each as "fencelock: <message>", to stderr. It
// returns the exit code: [ExitOK], [ExitError], [ExitUsage], [ExitNotFound] or
// [ExitLockTimeout]. ctx bounds every statement; when it ends, watch returns ExitOK and other
// commands fail (the binary cancels it on SIGINT and SIGTERM).
//
// Run opens a connection pool for the call and closes it before returning; it leaves no
// goroutine behind, except that watch's reader of a non-terminal stdin that cannot be given a
// read deadline ends only at that reader's EOF. Calls are independent and may run concurrently
// with different writers.
func Run(ctx context.Context, args []string, env func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	s := &session{env: env, stdin: stdin, stdout: stdout, stderr: stderr}
	defer s.close()
	err := s.run(ctx, args)
	if err == nil {
		return ExitOK
	}
	code := ExitError
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	// The library's errors begin with "fencelock: " too: say it once.
	fmt.Fprintln(stderr, "fencelock: "+strings.TrimPrefix(oneLine(err.Error()), "fencelock: "))
	return code
}

// run parses the global flags and the command's, and runs it.
func (s *session) run(ctx context.Context, args []string) error {
	top := flag.NewFlagSet("fencelock", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	s.globalFlags(top)
	version := top.Bool("version", false, "print the version (fencelock version)")
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			writeUsage(s.stdout)
			return nil
		}
		return withCode(ExitUsage, "%v (see fencelock help)", err)
	}
	if *version {
		return s.printVersion()
	}
	args = top.Args()
	if len(args) == 0 {
		writeUsage(s.stderr)
		return withCode(ExitUsage, "no command given")
	}
	name, args := args[0], args[1:]
	if name == "help" {
		return s.help(args)
	}
	for _, c := range commands() {
		if c.name != name {
			continue
		}
		fs := flag.NewFlagSet("fencelock "+c.name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		s.globalFlags(fs)
		runCmd := c.flags(fs)
		pos, err := parseInterspersed(fs, args)
		if errors.Is(err, flag.ErrHelp) {
			writeCommandUsage(s.stdout, c)
			return nil
		}
		if err != nil {
			return withCode(ExitUsage, "%s: %v (see fencelock help %s)", c.name, err, c.name)
		}
		return runCmd(ctx, s, pos)
	}
	return withCode(ExitUsage, "unknown command %q (see fencelock help)", name)
}

// help prints the usage, or one command's with "help COMMAND".
func (s *session) help(args []string) error {
	if len(args) == 0 {
		writeUsage(s.stdout)
		return nil
	}
	for _, c := range commands() {
		if c.name == args[0] {
			writeCommandUsage(s.stdout, c)
			return nil
		}
	}
	return withCode(ExitUsage, "unknown command %q (see fencelock help)", args[0])
}

// globalFlags registers the flags every command takes; values given before the command are
// the defaults of those after it.
func (s *session) globalFlags(fs *flag.FlagSet) {
	fs.StringVar(&s.url, "database-url", s.url, "PostgreSQL connection `URL` (default: $DATABASE_URL)")
	fs.BoolVar(&s.json, "json", s.json, "print JSON instead of a table")
}

// parseInterspersed parses fs's flags wherever they stand among args, as in "release --force
// NAME --fence ledger", and returns the positional arguments in order. Everything after "--"
// is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	// A negative advisory key ("-5", "-1,5"), as `fencelock locks` prints half of them, is an
	// argument, not a flag: taken out before the flags are parsed (up to a "--").
	kept := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			kept = append(kept, args[i:]...)
			break
		}
		if negativeKey.MatchString(a) && !(i > 0 && takesValue(fs, args[i-1])) {
			pos = append(pos, a)
			continue
		}
		kept = append(kept, a)
	}
	args = kept
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// takesValue reports whether arg is a flag of fs that takes the next argument as its value
// ("--fence", not "--fence=x" nor a boolean flag such as "--force").
func takesValue(fs *flag.FlagSet, arg string) bool {
	if !strings.HasPrefix(arg, "-") || strings.Contains(arg, "=") {
		return false
	}
	f := fs.Lookup(strings.TrimLeft(arg, "-"))
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}

// negativeKey matches a negative int64 advisory key or a key pair whose first key is negative.
var negativeKey = regexp.MustCompile(`^-[0-9]+(,-?[0-9]+)?$`)

// lineBreaks matches a line break with the indentation around it.
var lineBreaks = regexp.MustCompile(`[ \t]*[\r\n]+[ \t]*`)

// oneLine joins the lines of a message, so that each error is one line of stderr.
func oneLine(msg string) string {
	return lineBreaks.ReplaceAllString(strings.TrimSpace(msg), " ")
}
