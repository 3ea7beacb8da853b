package cli

import (
	"context"
	"flag"
	"fmt"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/ratelimit"
)

// sweepCommand is "fencelock sweep": [fencelock.SweepLeases] with --grace, then
// [ratelimit.Sweep] of the keys idle for longer than --grace.
func sweepCommand(fs *flag.FlagSet) func(context.Context, *session, []string) error {
	grace := fs.Duration("grace", fencelock.DefaultSweepGrace, "delete lease rows expired longer than this `duration` ago (at least 1m)")
	return func(ctx context.Context, s *session, args []string) error {
		if len(args) > 0 {
			return withCode(ExitUsage, "sweep: unexpected argument %q", args[0])
		}
		if *grace < fencelock.MinSweepGrace {
			return withCode(ExitUsage, "sweep: --grace %v is shorter than the minimum, %v", *grace, fencelock.MinSweepGrace)
		}
		pool, err := s.pool(ctx)
		if err != nil {
			return err
		}
		deleted, err := fencelock.SweepLeases(ctx, pool, *grace)
		if err != nil {
			return dbError(fmt.Sprintf("sweep (%d lease rows deleted before the error)", deleted), err)
		}
		keys, err := ratelimit.Sweep(ctx, pool, *grace)
		if err != nil {
			return dbError(fmt.Sprintf("sweep (%d lease rows deleted, then the rate-limit keys failed)", deleted), err)
		}
		if s.json {
			return s.printJSON(struct {
				Deleted         int64   `json:"deleted"`
				RateKeysDeleted int64   `json:"rate_keys_deleted"`
				GraceSeconds    float64 `json:"grace_seconds"`
			}{deleted, keys, grace.Seconds()})
		}
		_, err = fmt.Fprintf(s.stdout, "swept %s expired more than %s ago, and %s idle as long\n",
			plural(deleted, "lease row", "lease rows"), formatDuration(*grace), plural(keys, "rate-limit key", "rate-limit keys"))
		return err
	}
}
