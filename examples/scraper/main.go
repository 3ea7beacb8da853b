// Command scraper shows a scraping fleet kept within its limits by fencelock: one worker per
// account (a lease), at most a few workers per target domain at once (a semaphore), and at most
// so many requests per second to each domain (a rate limit).
//
// It starts three worker processes (this program again, as children), eight workers each. A
// worker takes an account's lease (TryAcquire: another worker has it, try another), then, for
// a few requests with that account: a permit of the domain's semaphore (Acquire: waits in the
// domain's queue), a request token from the domain's rate limit (Wait: sleeps until allowed),
// and the "request" itself, which records its start, in a transaction that guards both the
// account's lease and the permit (no takeover of either can commit before it), works for 40-80
// ms, and records its end the same way. A quarter into the run the parent stops one process
// (SIGSTOP) for longer than the TTL: its leases and permits lapse and go to others, and once it
// resumes its guarded writes are refused (ErrLeaseLost) and its workers start over. After the
// run the parent counts, from the database:
//
//	scraper: requests=N max_concurrent_per_domain=C cap=K max_rate_per_domain=R limit=L double_account_use=D
//
// N: requests completed; C: the most requests in flight to one domain at any instant of the
// database clock (from the recorded starts and ends); K: the semaphore's limit; R: the most
// requests to one domain allowed by the rate limit in any one-second window of the database
// clock (from the decisions' times); L: the limit per second (burst 1, so no window of a second
// holds more than L); D: pairs of requests that used one account at overlapping times from two
// workers (must be 0). It exits non-zero (after a line saying why, and the counts as its last
// line) unless C <= K, R <= L, D = 0 and N > 0.
//
// Run it with an embedded PostgreSQL (local server binaries or Docker, through package pgtest):
//
//	go run ./examples/scraper
//
// or against a database of your own, where it drops and recreates its table scraper_requests
// and scraper_lost and resets its rate-limit keys ("scraper:domain:*"):
//
//	DATABASE_URL=postgres://... go run ./examples/scraper
//
// FENCELOCK_SCRAPER_SECONDS sets how long the workers run (default 6, at least 4).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/examples/internal/demodb"
)

const (
	processes  = 3
	workers    = 8 // per process
	accounts   = 10
	domainCap  = 2  // workers per domain at once
	domainRate = 40 // requests per second per domain
	leaseTTL   = 2 * time.Second
	pause      = leaseTTL + 500*time.Millisecond // proc-2's SIGSTOP

	workerEnv = "FENCELOCK_SCRAPER_WORKER" // set in a child: its process id
	urlEnv    = "FENCELOCK_SCRAPER_URL"
)

var domains = []string{"example.com", "example.org", "example.net"}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if id := os.Getenv(workerEnv); id != "" {
		// The parent holds our stdin open: its end (the parent died, however) ends us too.
		ctx, cancel := context.WithCancel(ctx)
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			cancel()
		}()
		if err := process(ctx, id, os.Getenv(urlEnv)); err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "scraper process", id+":", err)
			os.Exit(1)
		}
		return
	}
	sum, err := run(ctx)
	fail := err != nil
	switch {
	case err != nil:
		fmt.Println("scraper: FAIL:", err)
	case sum.requests == 0:
		fmt.Println("scraper: FAIL: no request completed")
		fail = true
	case sum.concurrent > domainCap:
		fmt.Printf("scraper: FAIL: %d requests in flight to one domain, over the cap of %d\n", sum.concurrent, domainCap)
		fail = true
	case sum.rate > domainRate:
		fmt.Printf("scraper: FAIL: %d requests to one domain in one second, over the limit of %d\n", sum.rate, domainRate)
		fail = true
	case sum.doubleUse != 0:
		fmt.Printf("scraper: FAIL: %d pairs of requests used one account at once\n", sum.doubleUse)
		fail = true
	}
	if sum != nil { // the last line, FAIL or not
		fmt.Printf("scraper: requests=%d max_concurrent_per_domain=%d cap=%d max_rate_per_domain=%d limit=%d double_account_use=%d\n",
			sum.requests, sum.concurrent, domainCap, sum.rate, domainRate, sum.doubleUse)
	}
	if fail {
		os.Exit(1)
	}
}

type summary struct {
	requests, concurrent, rate, doubleUse int64
}

// run sets up the database, runs the worker processes, prints the domains' queues midway, and
// counts from the database.
func run(ctx context.Context) (_ *summary, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	seconds := 6
	if s := os.Getenv("FENCELOCK_SCRAPER_SECONDS"); s != "" {
		if seconds, err = strconv.Atoi(s); err != nil || seconds < 4 {
			return nil, fmt.Errorf("FENCELOCK_SCRAPER_SECONDS=%q: want a whole number of seconds >= 4", s)
		}
	}
	url, stopDB, err := demodb.URL(ctx, func(s string) { fmt.Println(s) })
	if err != nil {
		return nil, err
	}
	defer func() {
		if serr := stopDB(); serr != nil && err == nil {
			err = serr
		}
	}()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := fencelock.Migrate(ctx, pool); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS scraper_requests;
		CREATE TABLE scraper_requests (id bigserial PRIMARY KEY, domain text NOT NULL, account text NOT NULL,
			worker text NOT NULL, allowed_at timestamptz NOT NULL, started_at timestamptz NOT NULL, ended_at timestamptz);
		DROP TABLE IF EXISTS scraper_lost;
		CREATE TABLE scraper_lost (worker text NOT NULL, error text NOT NULL);
		DELETE FROM fencelock.rate_limits WHERE key LIKE 'scraper:domain:%'`); err != nil {
		return nil, err
	}
	for _, d := range domains { // the cap, for this run, whatever an earlier run left
		s, err := fencelock.NewSemaphore(mustLessor(pool), "scraper:domain:"+d, domainCap)
		if err != nil {
			return nil, err
		}
		if _, err := s.SetLimit(ctx, domainCap); err != nil {
			return nil, err
		}
	}

	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var cmds []*exec.Cmd
	var stdins []io.Closer
	for i := range processes {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), workerEnv+"=proc-"+strconv.Itoa(i+1), urlEnv+"="+url)
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		cmds = append(cmds, cmd)
		stdins = append(stdins, in)
	}
	stopped := false
	stopAll := func() error {
		if stopped {
			return nil
		}
		stopped = true
		var errs []error
		for _, c := range cmds {
			_ = c.Process.Signal(syscall.SIGTERM)
		}
		for _, c := range cmds {
			killLater := time.AfterFunc(10*time.Second, func() { _ = c.Process.Kill() })
			errs = append(errs, c.Wait())
			killLater.Stop()
		}
		for _, in := range stdins {
			_ = in.Close()
		}
		return errors.Join(errs...)
	}
	defer func() { _ = stopAll() }()
	fmt.Printf("%d processes x %d workers over %d accounts and %d domains (at most %d at once and %d requests/s each), for %ds\n",
		processes, workers, accounts, len(domains), domainCap, domainRate, seconds)
	// A quarter in, one process stops (SIGSTOP: a GC pause, a throttled container) past the
	// TTL: what it holds lapses and goes to others; once it resumes, its guarded writes are
	// refused, and its workers start over.
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(time.Duration(seconds) * time.Second / 4):
	}
	paused := cmds[1]
	if err := paused.Process.Signal(syscall.SIGSTOP); err != nil {
		return nil, err
	}
	time.Sleep(pause)
	if err := paused.Process.Signal(syscall.SIGCONT); err != nil {
		return nil, err
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(time.Duration(seconds) * time.Second / 4):
	}
	rows, err := pool.Query(ctx, `SELECT name, permit_limit, held, waiting FROM fencelock.semaphore_state WHERE name LIKE 'scraper:%' ORDER BY name`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name string
		var limit, held, waiting int64
		if err := rows.Scan(&name, &limit, &held, &waiting); err != nil {
			return nil, err
		}
		fmt.Printf("midway: %s permits %d/%d, %d waiting\n", name, held, limit, waiting)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(time.Duration(seconds) * time.Second / 2):
	}
	if err := stopAll(); err != nil {
		return nil, fmt.Errorf("a worker process failed: %w", err)
	}
	var lost int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM scraper_lost`).Scan(&lost); err != nil {
		return nil, err
	}
	fmt.Printf("proc-2 was paused for %v (TTL %v): %d of its workers found a lease or permit lost on waking and started over\n", pause, leaseTTL, lost)

	var s summary
	err = pool.QueryRow(ctx, `
		WITH done AS (SELECT * FROM scraper_requests WHERE ended_at IS NOT NULL)
		SELECT (SELECT count(*) FROM done),
		       (SELECT coalesce(max(n), 0) FROM (
		           SELECT count(*) AS n FROM done AS a JOIN done AS b
		             ON b.domain = a.domain AND b.started_at <= a.started_at AND a.started_at < b.ended_at
		           GROUP BY a.id) AS c),
		       (SELECT coalesce(max(n), 0) FROM (
		           SELECT count(*) AS n FROM scraper_requests AS a JOIN scraper_requests AS b
		             ON b.domain = a.domain AND b.allowed_at >= a.allowed_at AND b.allowed_at < a.allowed_at + interval '1 second'
		           GROUP BY a.id) AS r),
		       (SELECT count(*) FROM done AS a JOIN done AS b
		          ON b.account = a.account AND a.id < b.id AND a.worker <> b.worker
		         AND a.started_at < b.ended_at AND b.started_at < a.ended_at)`).Scan(&s.requests, &s.concurrent, &s.rate, &s.doubleUse)
	if err != nil {
		return nil, fmt.Errorf("count: %w", err)
	}
	return &s, nil
}

// mustLessor returns a lessor on pool with the default holder id (NewLessor fails only for a
// nil pool or a bad option).
func mustLessor(pool *pgxpool.Pool) *fencelock.Lessor {
	l, err := fencelock.NewLessor(pool)
	if err != nil {
		panic(err)
	}
	return l
}
