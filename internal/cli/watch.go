package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// clearScreen moves the cursor home and clears the screen (ANSI).
const clearScreen = "\x1b[H\x1b[2J"

// minWatchInterval is the shortest --interval watch accepts.
const minWatchInterval = 10 * time.Millisecond

// watchCommand is "fencelock watch".
func watchCommand(fs *flag.FlagSet) func(context.Context, *session, []string) error {
	name := fs.String("name", "", "show only resources matching the SQL LIKE `PATTERN`")
	interval := fs.Duration("interval", time.Second, "redraw every `duration`")
	return func(ctx context.Context, s *session, args []string) error {
		if len(args) > 0 {
			return withCode(ExitUsage, "watch: unexpected argument %q", args[0])
		}
		if *interval < minWatchInterval {
			return withCode(ExitUsage, "watch: --interval %v is shorter than %v", *interval, minWatchInterval)
		}
		pool, err := s.pool(ctx)
		if err != nil {
			return err
		}
		quit, stop := quitKeys(s.stdin)
		defer stop()
		tick := time.NewTicker(*interval)
		defer tick.Stop()
		for {
			if err := s.refresh(ctx, pool, *name); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-quit:
				return nil
			case <-tick.C:
			}
		}
	}
}

// refresh reads the locks and draws them: the whole screen in one write, or one NDJSON line
// with --json. A failed read is shown in place of the table (on stderr with --json), and the
// next refresh tries again; the error returned is stdout's, which ends watch.
func (s *session) refresh(ctx context.Context, pool *pgxpool.Pool, pattern string) error {
	rows, err := readLocks(ctx, pool, pattern)
	if ctx.Err() != nil {
		return nil // ending: nothing to draw
	}
	var frame bytes.Buffer
	switch {
	case s.json && err != nil:
		fmt.Fprintln(s.stderr, "fencelock: "+oneLine(err.Error()))
		return nil
	case s.json:
		line, _ := json.Marshal(rows) // a lockRow always marshals
		frame.Write(append(line, '\n'))
	default:
		frame.WriteString(clearScreen)
		fmt.Fprintf(&frame, "fencelock watch — %s — %s — q to quit\n\n", s.where(), time.Now().Format("15:04:05"))
		if err != nil {
			fmt.Fprintf(&frame, "error: %s\n", oneLine(err.Error()))
		} else {
			_ = writeLocksTable(&frame, rows) // a bytes.Buffer does not fail
		}
	}
	if _, err := s.stdout.Write(frame.Bytes()); err != nil {
		return fmt.Errorf("watch: write: %w", err)
	}
	return nil
}
