package cli

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// usageTail is the part of the usage after the commands: environment and exit codes.
const usageTail = `Every command takes:
  --database-url URL   PostgreSQL connection URL (default: $DATABASE_URL)
  --json               print one JSON document (watch: one array per refresh, one a line)

Environment:
  DATABASE_URL         the database, when --database-url is not given

Exit codes:
  0  ok
  1  an error: the database refused or could not be reached, output could not be written,
     a terminated backend did not exit, a lock held by a prepared transaction, or declined
     at the prompt
  2  usage error: unknown command or flag, missing argument, no database URL
  3  nothing held: release found no holder (a lease nobody holds: a lapsed grant's
     holder is fenced out all the same, a lease never granted is left unchanged;
     --advisory: no backend holds the lock), or the lease's last grant is not the one
     --token names (nothing changed)
  4  the lease row is locked by a transaction: lock timeout (release; see --lock-timeout),
     or a deadlock with a holder that fenced before it guarded (retry)

A negative advisory key may be given as it is (release --force --advisory -5) or after --.

Run "fencelock help COMMAND" for a command's flags.
`

// writeUsage writes the usage of the fencelock command: its commands with their flags,
// environment and exit codes.
func writeUsage(w io.Writer) {
	fmt.Fprint(w, "fencelock: PostgreSQL locks with fencing tokens, for operators\n\nUsage:\n  fencelock COMMAND [flags]\n  fencelock --version      the same as fencelock version\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
		writeFlags(w, c, "             ")
	}
	fmt.Fprint(w, "\n"+usageTail)
}

// writeCommandUsage writes one command's usage.
func writeCommandUsage(w io.Writer, c command) {
	fmt.Fprintf(w, "Usage:\n  fencelock %s %s\n\n%s.\n\nFlags:\n", c.name, c.synopsis, upperFirst(c.summary))
	writeFlags(w, c, "  ")
	fmt.Fprint(w, "\n"+usageTail)
}

// writeFlags lists c's own flags, one a line, each line indented by indent.
func writeFlags(w io.Writer, c command, indent string) {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	c.flags(fs)
	fs.VisitAll(func(f *flag.Flag) {
		arg, help := flag.UnquoteUsage(f)
		name := "--" + f.Name
		if arg != "" {
			name += " " + arg
		}
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "[]" {
			help += " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(w, "%s%-24s %s\n", indent, name, help)
	})
}

// upperFirst returns s with its first letter in upper case.
func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
