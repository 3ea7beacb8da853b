package cli

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// lockRow is one row of the locks table and one object of locks --json: a held lease, or a
// backend holding (or, with no holder, awaiting) an advisory lock. Fields of the other kind
// are left out of the JSON.
type lockRow struct {
	Kind     string `json:"kind"`     // "lease" or "advisory"
	Resource string `json:"resource"` // lease name; advisory: its name if known, else "key N" or "key K1,K2"
	// Holder is the lease's holder id; for an advisory lock, the backend: "pid N (addr)", or
	// "pid N (waiting, blocked by P,Q)" for a waiter shown because nobody holds the lock.
	Holder string `json:"holder"`
	// Heartbeat is "ok" or "late" for a lease (fencelock.holders); for an advisory lock
	// "session" ("session (shared)"), "waiting", or "prepared" (held by a prepared transaction).
	Heartbeat string `json:"heartbeat"`
	// Waiters: live waiters in the lease's queue; backends waiting for the advisory lock
	// (besides this row's, for a waiting row).
	Waiters        int64    `json:"waiters"`
	HeldForSeconds *float64 `json:"held_for_seconds,omitempty"` // advisory: since its transaction began, if in one

	// Leases (fencelock.holders).
	Token          *int64     `json:"token,omitempty"`
	AcquiredAt     *time.Time `json:"acquired_at,omitempty"`
	ExpiresAt      *time.Time `json:"expires_at,omitempty"`
	TTLLeftSeconds *float64   `json:"ttl_left_seconds,omitempty"`
	TTLSeconds     *float64   `json:"ttl_seconds,omitempty"`
	Renewals       *int64     `json:"renewals,omitempty"`
	LastRenewal    *time.Time `json:"last_renewal,omitempty"`
	NextHolder     *string    `json:"next_holder,omitempty"`

	// Advisory locks (fencelock.advisory_locks).
	Key             *int64     `json:"key,omitempty"`
	Key1            *int32     `json:"key1,omitempty"`
	Key2            *int32     `json:"key2,omitempty"`
	Name            *string    `json:"name,omitempty"`
	Mode            string     `json:"mode,omitempty"`
	Granted         *bool      `json:"granted,omitempty"`
	PID             *int32     `json:"pid,omitempty"`
	ApplicationName *string    `json:"application_name,omitempty"`
	ClientAddr      *string    `json:"client_addr,omitempty"`
	BackendStart    *time.Time `json:"backend_start,omitempty"`
	XactStart       *time.Time `json:"xact_start,omitempty"`
	State           *string    `json:"state,omitempty"`
	WaitStart       *time.Time `json:"waitstart,omitempty"`
	BlockedBy       []int32    `json:"blocked_by,omitempty"`
	WaitingPIDs     []int32    `json:"waiting_pids,omitempty"`

	heldFor *time.Duration // for the table; nil: "-"
	ttlLeft *time.Duration
}

// locksCommand is "fencelock locks".
func locksCommand(fs *flag.FlagSet) func(context.Context, *session, []string) error {
	name := fs.String("name", "", "show only resources matching the SQL LIKE `PATTERN`")
	return func(ctx context.Context, s *session, args []string) error {
		if len(args) > 0 {
			return withCode(ExitUsage, "locks: unexpected argument %q", args[0])
		}
		pool, err := s.pool(ctx)
		if err != nil {
			return err
		}
		rows, err := readLocks(ctx, pool, *name)
		if err != nil {
			return err
		}
		if s.json {
			return s.printJSON(rows)
		}
		return writeLocksTable(s.stdout, rows)
	}
}

// readLocks returns the held leases and the advisory locks whose resource matches the LIKE
// pattern (all when empty): leases first, then advisory locks, each sorted by resource (then
// pid). Never nil, so that JSON shows [] for nothing held.
func readLocks(ctx context.Context, pool *pgxpool.Pool, pattern string) ([]lockRow, error) {
	if pattern == "" {
		pattern = "%"
	}
	leases, err := readLeases(ctx, pool, pattern)
	if err != nil {
		return nil, err
	}
	advisory, err := readAdvisory(ctx, pool, pattern)
	if err != nil {
		return nil, err
	}
	rows := append(append(make([]lockRow, 0, len(leases)+len(advisory)), leases...), advisory...)
	kindOrder := map[string]int{"lease": 0, "advisory": 1}
	slices.SortStableFunc(rows, func(a, b lockRow) int {
		return cmp.Or(cmp.Compare(kindOrder[a.Kind], kindOrder[b.Kind]), cmp.Compare(a.Resource, b.Resource),
			cmp.Compare(deref(a.PID), deref(b.PID)))
	})
	return rows, nil
}

// readLeases reads fencelock.holders.
func readLeases(ctx context.Context, pool *pgxpool.Pool, pattern string) ([]lockRow, error) {
	rows, err := pool.Query(ctx, `
		SELECT name, holder, token, acquired_at, expires_at,
		       (extract(epoch FROM held_for) * 1000000.0)::bigint,
		       (extract(epoch FROM ttl_left) * 1000000.0)::bigint,
		       (extract(epoch FROM ttl) * 1000000.0)::bigint,
		       renewals, last_renewal, heartbeat, waiters, next_holder
		FROM fencelock.holders
		WHERE name LIKE $1`, pattern)
	if err != nil {
		return nil, dbError("read fencelock.holders", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lockRow, error) {
		var (
			l                     lockRow
			token, renewals       int64
			acquired, expires     time.Time
			heldUS, leftUS, ttlUS int64
		)
		err := r.Scan(&l.Resource, &l.Holder, &token, &acquired, &expires, &heldUS, &leftUS, &ttlUS,
			&renewals, &l.LastRenewal, &l.Heartbeat, &l.Waiters, &l.NextHolder)
		l.Kind = "lease"
		l.Token, l.Renewals = &token, &renewals
		l.AcquiredAt, l.ExpiresAt = &acquired, &expires
		l.HeldForSeconds, l.TTLLeftSeconds, l.TTLSeconds = ptr(seconds(heldUS)), ptr(seconds(leftUS)), ptr(seconds(ttlUS))
		l.heldFor, l.ttlLeft = ptr(micros(heldUS)), ptr(micros(leftUS))
		return l, err
	})
	if err != nil {
		return nil, dbError("read fencelock.holders", err)
	}
	return out, nil
}

// readAdvisory reads fencelock.advisory_locks: one row per backend holding a lock, with the
// count of backends waiting for the same key; one row for the first waiter of a key that
// nobody holds. The resource of a key is the name of a holding session if any, else of a
// waiting one, else "key N" ("key K1,K2" for a pair key). A fencelock session carries its
// lock's name only once its locker's watchdog has first probed the lock (within one watchdog
// interval of the grant): a younger lock, and one taken by key without a name, show by key.
func readAdvisory(ctx context.Context, pool *pgxpool.Pool, pattern string) ([]lockRow, error) {
	rows, err := pool.Query(ctx, `
		SELECT r.resource, r.key, r.key1, r.key2, r.name, r.mode, r.granted, r.pid, r.application_name,
		       host(r.client_addr), r.backend_start, r.xact_start,
		       (extract(epoch FROM clock_timestamp() - r.xact_start) * 1000000.0)::bigint,
		       r.state, r.waitstart, r.blocked_by
		FROM (SELECT a.*, coalesce(max(a.name) FILTER (WHERE a.granted) OVER w, max(a.name) OVER w,
		                           CASE WHEN a.key IS NOT NULL THEN 'key ' || a.key::text
		                                ELSE 'key ' || a.key1::text || ',' || a.key2::text END) AS resource
		      FROM fencelock.advisory_locks AS a
		      WINDOW w AS (PARTITION BY a.key, a.key1, a.key2)) AS r
		WHERE r.resource LIKE $1
		ORDER BY r.key, r.key1, r.key2, r.granted DESC, r.waitstart, r.pid`, pattern)
	if err != nil {
		return nil, dbError("read fencelock.advisory_locks", err)
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lockRow, error) {
		var (
			l       lockRow
			granted bool
			heldUS  *int64
		)
		err := r.Scan(&l.Resource, &l.Key, &l.Key1, &l.Key2, &l.Name, &l.Mode, &granted, &l.PID, &l.ApplicationName,
			&l.ClientAddr, &l.BackendStart, &l.XactStart, &heldUS, &l.State, &l.WaitStart, &l.BlockedBy)
		l.Kind = "advisory"
		l.Granted = &granted
		if heldUS != nil {
			l.HeldForSeconds, l.heldFor = ptr(seconds(*heldUS)), ptr(micros(*heldUS))
		}
		return l, err
	})
	if err != nil {
		return nil, dbError("read fencelock.advisory_locks", err)
	}
	return groupAdvisory(all), nil
}

// groupAdvisory folds the rows of fencelock.advisory_locks, ordered by key with granted rows
// first, into the rows of the table: each holder with the waiters of its key counted in, or
// the first waiter when nobody holds the key.
func groupAdvisory(all []lockRow) []lockRow {
	var out []lockRow
	for len(all) > 0 {
		n := 1
		for n < len(all) && sameKey(all[0], all[n]) {
			n++
		}
		group := all[:n]
		all = all[n:]
		var held, waiting []lockRow
		for _, r := range group {
			if *r.Granted {
				held = append(held, r)
			} else {
				waiting = append(waiting, r)
			}
		}
		waitingPIDs := make([]int32, 0, len(waiting))
		for _, w := range waiting {
			waitingPIDs = append(waitingPIDs, deref(w.PID))
		}
		if len(held) == 0 { // show the first waiter, and count the others
			held, waiting, waitingPIDs = waiting[:1], waiting[1:], waitingPIDs[1:]
		}
		for _, r := range held {
			r.Waiters = int64(len(waiting))
			if len(waitingPIDs) > 0 {
				r.WaitingPIDs = waitingPIDs
			}
			r.Holder, r.Heartbeat = advisoryHolder(r)
			out = append(out, r)
		}
	}
	return out
}

// advisoryHolder returns the HOLDER and HEARTBEAT cells of an advisory lock's row.
func advisoryHolder(r lockRow) (holder, state string) {
	if r.PID == nil { // pg_locks shows a prepared transaction's locks without a pid
		return "prepared transaction", "prepared"
	}
	label := backendLabel(*r.PID, deref(r.ClientAddr))
	if *r.Granted {
		if r.Mode == "shared" {
			return label, "session (shared)"
		}
		return label, "session"
	}
	if len(r.BlockedBy) == 0 {
		return fmt.Sprintf("pid %d (waiting)", deref(r.PID)), "waiting"
	}
	return fmt.Sprintf("pid %d (waiting, blocked by %s)", deref(r.PID), joinPIDs(r.BlockedBy)), "waiting"
}

// sameKey reports whether two advisory rows are of the same lock key.
func sameKey(a, b lockRow) bool {
	return deref(a.Key) == deref(b.Key) && (a.Key == nil) == (b.Key == nil) &&
		deref(a.Key1) == deref(b.Key1) && deref(a.Key2) == deref(b.Key2)
}

// ptr returns a pointer to v.
func ptr[T any](v T) *T { return &v }

// deref returns *p, or the zero value for nil.
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
