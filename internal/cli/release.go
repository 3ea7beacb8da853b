package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/forcedrelease"
	"github.com/fencelock/fencelock/internal/validate"
)

// defaultLockTimeout is how long release waits for the lease row by default.
const defaultLockTimeout = 5 * time.Second

// releaseResult is the outcome of release --force NAME, and its --json object.
type releaseResult struct {
	Lease     string   `json:"lease"`
	Held      bool     `json:"held"`       // whether a grant was current and was ended
	OldHolder *string  `json:"old_holder"` // the holder of the last grant; null when the name never had one
	OldToken  *int64   `json:"old_token"`  // its token
	Lapsed    bool     `json:"lapsed"`     // the last grant had expired already (not taken over): fenced out, nothing ended
	NewToken  *int64   `json:"new_token"`  // the token that now fences the old holder out; null when nothing changed (--token did not match)
	HandedTo  *string  `json:"handed_to"`  // the waiter the lease went to, with NewToken; null if none
	Woken     *string  `json:"woken"`      // a semaphore's permit freed, not given: the head of the semaphore's queue, told to take it; null if none
	Waiting   int64    `json:"waiting"`    // live waiters left in the queue
	Fenced    []string `json:"fenced"`     // resources whose high-water mark is now at least NewToken; empty when nothing changed
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// releaseCommand is "fencelock release".
func releaseCommand(fs *flag.FlagSet) func(context.Context, *session, []string) error {
	force := fs.Bool("force", false, "required: release whoever holds it (an operator's release is always someone else's); exit 3 when nobody does (a lapsed grant's holder is still fenced out)")
	var fence stringList
	fs.Var(&fence, "fence", "also raise this `RESOURCE`'s high-water mark to the new token (repeatable; NAME is always fenced)")
	lockTimeout := fs.Duration("lock-timeout", defaultLockTimeout, "give up (exit 4) when the lease row stays locked this `duration` (0: wait without limit)")
	token := fs.Int64("token", 0, "release only the grant with this fencing `TOKEN` (as `fencelock locks` shows it); exit 3 and change nothing when the current grant has another")
	advisory := fs.Bool("advisory", false, "NAME is an advisory lock's name, int64 key, or K1,K2 key pair: terminate the backends that hold it")
	yes := fs.Bool("yes", false, "with --advisory: terminate without asking")
	namespace := fs.String("namespace", fencelock.DefaultNamespace, "with --advisory: the `namespace` a NAME is hashed in (fencelock.WithNamespace)")
	return func(ctx context.Context, s *session, args []string) error {
		switch {
		case len(args) != 1:
			return withCode(ExitUsage, "release: want one NAME, got %d arguments", len(args))
		case !*force:
			return withCode(ExitUsage, "release: a release of someone else's lock needs --force: fencelock release --force %s", args[0])
		case args[0] == "":
			return withCode(ExitUsage, "release: NAME is empty")
		case *advisory && len(fence) > 0:
			return withCode(ExitUsage, "release: --fence applies to leases, not to --advisory")
		case !*advisory && *yes:
			return withCode(ExitUsage, "release: --yes applies to --advisory only")
		case *lockTimeout < 0:
			return withCode(ExitUsage, "release: --lock-timeout %v is negative", *lockTimeout)
		case *lockTimeout > maxLockTimeout:
			return withCode(ExitUsage, "release: --lock-timeout %v is above PostgreSQL's limit of %v", *lockTimeout, maxLockTimeout)
		case *token < 0 || (*token == 0 && tokenGiven(fs)):
			return withCode(ExitUsage, "release: --token %d: a fencing token is > 0", *token)
		case *advisory && *token != 0:
			return withCode(ExitUsage, "release: --token applies to leases, not to --advisory")
		}
		if *advisory {
			arg, err := parseAdvisoryArg(args[0], *namespace)
			if err != nil {
				return withCode(ExitUsage, "release: %v", err)
			}
			return s.releaseAdvisory(ctx, arg, *yes)
		}
		resources := unique(append([]string{args[0]}, fence...))
		for _, r := range resources {
			if r == "" {
				return withCode(ExitUsage, "release: --fence with an empty resource")
			}
			// The bounds of a name and a resource (1 to 1024 bytes of UTF-8 without NUL):
			// fencelock.force_release writes lease and fence rows, whose tables check them no
			// more (migration 00013), so this entry point checks them as the library's do.
			var bad *validate.ArgumentError
			if errors.As(validate.Name("resource", r), &bad) {
				return withCode(ExitUsage, "release: NAME or --fence %.40q: %s", r, bad.Reason)
			}
		}
		var expected *int64
		if *token > 0 {
			expected = token
		}
		return s.releaseLease(ctx, args[0], resources, *lockTimeout, expected)
	}
}

// maxLockTimeout is the largest lock_timeout PostgreSQL takes: INT_MAX milliseconds.
const maxLockTimeout = time.Duration(1<<31-1) * time.Millisecond

// releaseLease ends the grant of lease name, whoever holds it, and raises the high-water mark
// of each resource, by fencelock.force_release in a transaction with lock_timeout. A lease
// nobody holds exits ExitNotFound: when its last grant had lapsed, its holder is fenced out
// all the same (committed); when it was never granted (or not since its last forced
// release), nothing changes (rolled back). With --token, a lapsed grant it names is fenced
// out and the release exits ExitOK: the grant the operator named is over.
func (s *session) releaseLease(ctx context.Context, name string, resources []string, lockTimeout time.Duration, expected *int64) error {
	pool, err := s.pool(ctx)
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return dbError("begin", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	if err := forcedrelease.SetLockTimeout(ctx, tx, lockTimeout); err != nil {
		return dbError("release", err)
	}

	// While force_release waits for the row, find out from a second connection who it waits
	// for. The connection is opened first: opened once the statement had begun, it could come
	// after a short --lock-timeout had ended the wait, and the message named nobody. When it
	// cannot be opened (the server's max_connections reached, say), the release goes on and a
	// lock timeout's message says why it names nobody.
	stop := make(chan struct{})
	found := make(chan []blocker, 1)
	pid := conn.Conn().PgConn().PID()
	watch, werr := pool.Acquire(ctx)
	if werr == nil {
		defer watch.Release()
		go func() { found <- watchBlockers(ctx, watch, pid, pollEvery(lockTimeout), stop) }()
	} else {
		found <- nil
	}
	describe := func(bs []blocker) string {
		if werr != nil {
			return fmt.Sprintf("could not open a second connection to sample pg_blocking_pids: %v", werr)
		}
		return describeBlockers(bs)
	}
	res := releaseResult{Lease: name, Fenced: resources}
	fr, err := forcedrelease.Run(ctx, tx, name, resources, expected)
	res.OldHolder, res.OldToken, res.Lapsed, res.NewToken, res.HandedTo, res.Woken = fr.OldHolder, fr.OldToken, fr.Lapsed, fr.NewToken, fr.HandedTo, fr.Woken
	close(stop)
	blockers := <-found
	if forcedrelease.Deadlock(err) {
		return withCode(ExitLockTimeout, "release lease %q: a transaction of the holder locked a fence row and then the lease row while this release held the lease row and waited for the fence row (PostgreSQL ended the release to break the deadlock; %s): retry; the holder should guard (Lease.GuardTx) before it fences",
			name, describe(blockers))
	}
	if forcedrelease.LockTimeout(err) {
		return withCode(ExitLockTimeout, "release lease %q: the lease row is locked by another transaction: a transaction-scoped holder (Lessor.RunLocked), a guarded transaction of its holder (Lease.GuardTx, Lease.FenceTx) or a grant in flight (else a fenced write holding a fence row); %s; gave up after --lock-timeout %v: retry once it ends, or raise --lock-timeout",
			name, describe(blockers), lockTimeout)
	}
	if err != nil {
		return dbError(fmt.Sprintf("release lease %q", name), err)
	}
	// The name's queue, and for a semaphore's permit (<semaphore>#<slot>) the semaphore's.
	if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM fencelock.lease_queue WHERE name = $1)
		+ (SELECT count(*) FROM fencelock.semaphore_waiters AS w
		   WHERE $1 ~ '#[0-9]+$' AND w.expires_at > clock_timestamp()
		     AND w.semaphore = pg_catalog.left($1, pg_catalog.length($1) - pg_catalog.strpos(pg_catalog.reverse($1), '#')))`,
		name).Scan(&res.Waiting); err != nil {
		return dbError("read the queue", err)
	}
	if res.OldHolder == nil && expected == nil {
		// Never granted, or not since its last forced release (which fenced that holder out
		// already): there is no holder to fence out. Roll back, so that a mistyped name leaves
		// no lease row and no fence behind.
		if err := tx.Rollback(ctx); err != nil {
			return dbError(fmt.Sprintf("release lease %q: roll back", name), err)
		}
		res.NewToken = nil
	} else if err := tx.Commit(ctx); err != nil {
		return dbError(fmt.Sprintf("release lease %q: commit", name), err)
	}
	res.Held = res.OldHolder != nil && !res.Lapsed && res.NewToken != nil
	if res.NewToken == nil { // nothing changed: no grant to end, or --token did not match
		res.Fenced = []string{}
		if s.json {
			if err := s.printJSON(res); err != nil {
				return err
			}
		}
		switch {
		case expected == nil:
			return withCode(ExitNotFound, "release lease %q: not held: never granted (or not since its last forced release); nothing changed, no fence raised", name)
		case res.OldHolder == nil:
			return withCode(ExitNotFound, "release lease %q: never granted, so not the grant with token %d; nothing changed", name, *expected)
		}
		return withCode(ExitNotFound, "release lease %q: its last grant is %s's with token %d, not %d; nothing changed", name, cell(*res.OldHolder), *res.OldToken, *expected)
	}
	if !res.Held && expected == nil {
		// The last grant had lapsed (expired, not taken over): nobody held the lease, but its
		// holder may be a zombie still, and is now fenced out.
		if s.json {
			if err := s.printJSON(res); err != nil {
				return err
			}
		}
		return withCode(ExitNotFound, "release lease %q: not held: the grant of %s (token %d) had lapsed; fenced with token %d (%s), so its holder's fenced writes are refused",
			name, cell(*res.OldHolder), *res.OldToken, *res.NewToken, strings.Join(res.Fenced, ", "))
	}
	if s.json {
		return s.printJSON(res)
	}
	_, err = fmt.Fprintln(s.stdout, describeRelease(res))
	return err
}

// describeRelease renders the outcome of a forced release in one line. releaseLease prints it
// for a release that exits ExitOK: a grant ended, or the lapsed grant that --token named
// fenced out (a lease nobody held exits ExitNotFound, with a message of its own).
func describeRelease(r releaseResult) string {
	fenced := fmt.Sprintf("fenced with token %d (%s)", deref(r.NewToken), strings.Join(r.Fenced, ", "))
	if r.Lapsed && r.OldHolder != nil {
		return fmt.Sprintf("lease %q: the grant of %s (token %d) had lapsed; %s", r.Lease, cell(*r.OldHolder), deref(r.OldToken), fenced)
	}
	if !r.Held {
		return fmt.Sprintf("lease %q was not held; %s", r.Lease, fenced)
	}
	then := "nobody waited"
	switch {
	case r.HandedTo != nil:
		then = "handed to " + cell(*r.HandedTo)
	case r.Woken != nil:
		then = "freed; woke the head of the queue, " + cell(*r.Woken) + ", to take it"
	case r.Waiting > 0:
		then = "woke the next waiter to take it"
	}
	return fmt.Sprintf("released lease %q held by %s (token %d); %s; %s", r.Lease, cell(deref(r.OldHolder)), deref(r.OldToken), fenced, then)
}

// unique returns ss without repeats, in order of first appearance.
func unique(ss []string) []string {
	var out []string
	for _, s := range ss {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// pollEvery is how often release looks for the transactions its statement waits for: eight
// times per lock timeout, between 10ms and 200ms (200ms without a lock timeout).
func pollEvery(lockTimeout time.Duration) time.Duration {
	if lockTimeout == 0 {
		return 200 * time.Millisecond
	}
	return min(max(lockTimeout/8, 10*time.Millisecond), 200*time.Millisecond)
}

// blocker is a backend that holds a lock another waits for.
type blocker struct {
	pid       int32
	app, addr string
	inXact    *time.Duration // how long its transaction has been open
}

// watchBlockers polls pg_blocking_pids(pid) on conn at once and then every interval until stop
// closes, and returns the last non-empty answer (nil if none). Errors of the polls are
// ignored: the answer only improves a message.
func watchBlockers(ctx context.Context, conn *pgxpool.Conn, pid uint32, every time.Duration, stop <-chan struct{}) []blocker {
	var last []blocker
	t := time.NewTicker(every)
	defer t.Stop()
	for first := true; ; first = false {
		if !first {
			select {
			case <-stop:
				return last
			case <-ctx.Done():
				return last
			case <-t.C:
			}
		}
		rows, err := conn.Query(ctx, `
			SELECT b.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
			       (extract(epoch FROM clock_timestamp() - a.xact_start) * 1000000.0)::bigint
			FROM pg_catalog.unnest(pg_catalog.pg_blocking_pids($1)) AS b(pid)
			LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = b.pid
			ORDER BY b.pid`, int32(pid))
		if err != nil {
			continue
		}
		var got []blocker
		for rows.Next() {
			var (
				b  blocker
				us *int64
			)
			if rows.Scan(&b.pid, &b.app, &b.addr, &us) == nil {
				if us != nil {
					b.inXact = ptr(micros(*us))
				}
				got = append(got, b)
			}
		}
		rows.Close()
		if len(got) > 0 {
			last = got
		}
	}
}

// describeBlockers names the blocking backends for the lock-timeout message.
func describeBlockers(bs []blocker) string {
	if len(bs) == 0 {
		return "pg_blocking_pids named no backend while it waited"
	}
	parts := make([]string, len(bs))
	for i, b := range bs {
		var detail []string
		if b.app != "" {
			detail = append(detail, "application_name "+cell(b.app))
		}
		if b.addr != "" {
			detail = append(detail, b.addr)
		}
		if b.inXact != nil {
			detail = append(detail, "transaction open for "+formatDuration(*b.inXact))
		}
		parts[i] = fmt.Sprintf("pid %d", b.pid)
		if len(detail) > 0 {
			parts[i] += " (" + strings.Join(detail, ", ") + ")"
		}
	}
	return "pg_blocking_pids: " + strings.Join(parts, ", ")
}

// tokenGiven reports whether --token was on the command line (--token 0 is then an error, not
// "no guard").
func tokenGiven(fs *flag.FlagSet) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "token" })
	return given
}
