package cli

import (
	"context"
	"flag"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// fenceRow is one row of the fences table and one object of fences --json.
type fenceRow struct {
	Resource      string  `json:"resource"`
	HighWaterMark int64   `json:"high_water_mark"`
	Holder        *string `json:"holder"`       // the current holder of the lease of the same name; null if none
	HolderToken   *int64  `json:"holder_token"` // its token; null if none
}

// fencesCommand is "fencelock fences".
func fencesCommand(fs *flag.FlagSet) func(context.Context, *session, []string) error {
	name := fs.String("name", "", "show only resources matching the SQL LIKE `PATTERN`")
	return func(ctx context.Context, s *session, args []string) error {
		if len(args) > 0 {
			return withCode(ExitUsage, "fences: unexpected argument %q", args[0])
		}
		pool, err := s.pool(ctx)
		if err != nil {
			return err
		}
		pattern := *name
		if pattern == "" {
			pattern = "%"
		}
		rows, err := pool.Query(ctx, `
			SELECT f.resource, f.token, h.holder, h.token
			FROM fencelock.fences AS f
			LEFT JOIN fencelock.holders AS h ON h.name = f.resource
			WHERE f.resource LIKE $1
			ORDER BY f.resource`, pattern)
		if err != nil {
			return dbError("read fencelock.fences", err)
		}
		fences, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fenceRow, error) {
			var f fenceRow
			err := r.Scan(&f.Resource, &f.HighWaterMark, &f.Holder, &f.HolderToken)
			return f, err
		})
		if err != nil {
			return dbError("read fencelock.fences", err)
		}
		if s.json {
			if fences == nil {
				fences = []fenceRow{}
			}
			return s.printJSON(fences)
		}
		if len(fences) == 0 {
			_, err := fmt.Fprintln(s.stdout, "no fences")
			return err
		}
		cells := make([][]string, len(fences))
		for i, f := range fences {
			holder, token := "-", "-"
			if f.Holder != nil {
				holder, token = cell(*f.Holder), strconv.FormatInt(deref(f.HolderToken), 10)
			}
			cells[i] = []string{cell(f.Resource), strconv.FormatInt(f.HighWaterMark, 10), holder, token}
		}
		return writeTable(s.stdout, []string{"RESOURCE", "HIGH-WATER MARK", "HOLDER", "HOLDER TOKEN"}, cells)
	}
}
