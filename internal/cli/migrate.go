package cli

import (
	"context"
	"flag"
	"fmt"

	"github.com/fencelock/fencelock"
)

// migrateCommand is "fencelock migrate": [fencelock.Migrate], then the schema version.
func migrateCommand(fs *flag.FlagSet) func(context.Context, *session, []string) error {
	return func(ctx context.Context, s *session, args []string) error {
		if len(args) > 0 {
			return withCode(ExitUsage, "migrate: unexpected argument %q", args[0])
		}
		pool, err := s.pool(ctx)
		if err != nil {
			return err
		}
		if err := fencelock.Migrate(ctx, pool); err != nil {
			return err
		}
		var version int64
		if err := pool.QueryRow(ctx, `SELECT max(version_id) FROM fencelock.goose_db_version WHERE is_applied`).Scan(&version); err != nil {
			return dbError("read the schema version", err)
		}
		if s.json {
			return s.printJSON(struct {
				Version int64 `json:"version"`
			}{version})
		}
		_, err = fmt.Fprintf(s.stdout, "fencelock schema at version %d\n", version)
		return err
	}
}
