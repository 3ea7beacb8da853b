package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
)

// semChildEnv, when set, turns the test binary into a semaphore child process (runSemChild):
// its value is a semChildConfig in JSON.
const semChildEnv = "FENCELOCK_CHAOS_SEM_CHILD"

// semChildConfig configures a semaphore child: Goroutines goroutines that each, forever, wait
// for a permit of Sem (limit Limit, TTL TTL), hold it for up to Hold, and release it. Its
// connections carry application_name App, so the parent can terminate their backends.
type semChildConfig struct {
	URL        string
	App        string
	Sem        string
	Limit      int
	TTL        time.Duration
	Hold       time.Duration
	Goroutines int
}

// runSemChild is the semaphore child process; it runs until killed, or until its stdin, a
// pipe the test holds, ends (the test binary has exited, outside Linux; see testkit.StartChild).
func runSemChild(js string) int {
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	var cfg semChildConfig
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	pcfg, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = cfg.App
	pcfg.MaxConns = 8
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	l, err := fencelock.NewLessor(pool, fencelock.WithHolder(cfg.App), backoffUpTo(50*time.Millisecond))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	s, err := fencelock.NewSemaphore(l, cfg.Sem, cfg.Limit)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var wg sync.WaitGroup
	for g := range cfg.Goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(g)))
			for {
				actx, cancel := context.WithTimeout(ctx, 10*time.Second)
				p, err := s.Acquire(actx, cfg.TTL)
				cancel()
				if err != nil {
					time.Sleep(10 * time.Millisecond) // a terminated backend, say: try again
					continue
				}
				select {
				case <-p.Done():
				case <-time.After(time.Duration(rng.Int64N(int64(cfg.Hold)))):
				}
				_ = p.Release(ctx)
			}
		})
	}
	wg.Wait()
	return 0
}

const (
	// semPhaseGrants is how many grants each of scenario 14's three phases needs: 3 of them
	// make more than the 200 grants the scenario asks for power.
	semPhaseGrants = 70
	// semDeadline bounds scenario 14's faults: a quiet machine needs 12 s.
	semDeadline = 2 * time.Minute
)

// semChild is the test's handle on a semaphore child.
type semChild struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

func startSemChild(t *testing.T, cfg semChildConfig) *semChild {
	t.Helper()
	js, err := json.Marshal(cfg)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), semChildEnv+"="+string(js))
	_, err = cmd.StdinPipe()
	require.NoError(t, err)
	testkit.StartChild(t, cmd)
	c := &semChild{cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.exited) }()
	// stdin stays open (cmd holds it) until Wait has seen the child exit.
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-c.exited })
	return c
}

func (c *semChild) kill() { _ = c.cmd.Process.Kill(); <-c.exited }

// permitSpan is one grant of a permit as the database logged it: from its grant to its last
// expiry (a release moves it to the release's time; a renewal moves it later).
type permitSpan struct {
	name     string
	token    int64
	from, to time.Time
	released bool // its last change was a release (else it lapsed by its TTL)
}

// Scenario 14: a semaphore (limit 5) under 200 goroutines in 4 child processes that wait for,
// hold and release permits, while the harness pauses whole processes past the TTL (SIGSTOP,
// SIGCONT), terminates random backends of theirs, and kills processes (SIGKILL) and starts new
// ones; the limit is lowered to 3 for the middle of the run's three phases. Triggers log every
// change of a permit row and of the limit; from those logs: never more than 5 permits
// unexpired at any instant of the database clock, at each grant no more permits unexpired
// (itself included) than the limit then in force, each permit's tokens rise, and some permits
// did lapse (the faults bit). Once every child is dead, every permit comes back: all 5 are
// granted to a newcomer within a TTL, and no waiter is left in the queue.
//
// Each phase runs until it has semPhaseGrants grants and has lasted 4 s (12 s in all on a
// quiet machine), so the grants the checks need for power come from the run's length: a
// loaded machine runs longer, up to semDeadline, and fails only if a check breaks or the
// deadline passes with too few grants. It uses only the public Semaphore API and the logs.
func TestScenarioSemaphoreFaults(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{scenario: "14-semaphore-faults", timeout: semDeadline + 2*time.Minute})
	ctx, db := e.ctx, e.db
	const (
		sem   = "chaos:sem"
		limit = 5
		ttl   = 500 * time.Millisecond
	)
	_, err := db.Pool.Exec(ctx, `
		CREATE TABLE sem_log (id bigserial PRIMARY KEY, name text, token bigint, acquired_at timestamptz,
			expires_at timestamptz, released boolean);
		CREATE FUNCTION sem_log() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO public.sem_log (name, token, acquired_at, expires_at, released)
			VALUES (NEW.name, NEW.token, NEW.acquired_at, NEW.expires_at, NEW.expires_at <= clock_timestamp());
			RETURN NULL;
		END $$;
		CREATE TRIGGER sem_log AFTER INSERT OR UPDATE ON fencelock.leases FOR EACH ROW
			WHEN (NEW.name LIKE 'chaos:sem#%') EXECUTE FUNCTION sem_log();
		CREATE TABLE sem_limits (at timestamptz, permit_limit int);
		CREATE FUNCTION sem_limits() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO public.sem_limits VALUES (clock_timestamp(), NEW.permit_limit);
			RETURN NULL;
		END $$;
		CREATE TRIGGER sem_limits AFTER INSERT OR UPDATE OF permit_limit ON fencelock.semaphores FOR EACH ROW
			EXECUTE FUNCTION sem_limits();`)
	require.NoError(t, err)

	cfg := semChildConfig{URL: db.URL, Sem: sem, Limit: limit, TTL: ttl, Hold: 30 * time.Millisecond, Goroutines: 50}
	children := make([]*semChild, 4)
	next := 0
	start := func(i int) {
		cfg.App = fmt.Sprintf("semchild-%d", next)
		next++
		children[i] = startSemChild(t, cfg)
	}
	for i := range children {
		start(i)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 14))
	var pauses, terminated, kills int
	setter, err := fencelock.NewLessor(db.Pool, fencelock.WithHolder("setter"))
	require.NoError(t, err)
	ss, err := fencelock.NewSemaphore(setter, sem, limit)
	require.NoError(t, err)
	grantCount := func() int { // grants so far, from the log (a permit's token is its grant's)
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(DISTINCT token) FROM sem_log`).Scan(&n))
		return n
	}
	// Three phases of faults, under the limit of 5, then 3, then 5 again. Each lasts until it
	// has seen semPhaseGrants grants and minPhase has passed: its grants come from the run's
	// length, not from the machine's speed. Past semDeadline with a phase still short of
	// grants, the run fails as too short to say anything.
	minPhase := time.Duration(runs(1)) * 4 * time.Second
	perPhase := runs(1) * semPhaseGrants
	limits := []int{limit, 3, limit}
	phaseGrants := make([]int, len(limits))
	began := time.Now()
	short := "" // why the run said too little, if it did (checked last: a broken invariant comes first)
phases:
	for i, lim := range limits {
		if i > 0 { // the limit changes at run time
			_, err := ss.SetLimit(ctx, lim)
			require.NoError(t, err)
		}
		phaseStart, base := time.Now(), grantCount()
		for {
			phaseGrants[i] = grantCount() - base
			if phaseGrants[i] >= perPhase && time.Since(phaseStart) >= minPhase {
				break
			}
			if time.Since(began) > semDeadline {
				short = fmt.Sprintf("too few grants to say anything: phase %d (limit %d) had %d of %d when the deadline passed, %v into the faults (grants by phase: %v)",
					i+1, lim, phaseGrants[i], perPhase, time.Since(began).Round(time.Second), phaseGrants)
				if lim != limit { // the newcomer below counts on the full limit
					_, err := ss.SetLimit(ctx, limit)
					require.NoError(t, err)
				}
				break phases
			}
			time.Sleep(jitter(300*time.Millisecond, 800*time.Millisecond))
			c := rng.IntN(len(children))
			switch rng.IntN(3) {
			case 0: // pause a whole process past the TTL
				p := children[c].cmd.Process
				require.NoError(t, p.Signal(syscall.SIGSTOP))
				time.Sleep(jitter(ttl+100*time.Millisecond, 2*ttl))
				require.NoError(t, p.Signal(syscall.SIGCONT))
				pauses++
			case 1: // kill a few backends of the children
				var n int
				require.NoError(t, db.Pool.QueryRow(ctx, `
					SELECT count(pg_terminate_backend(pid)) FROM (
						SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'semchild-%' ORDER BY random() LIMIT 3) AS a`).Scan(&n))
				terminated += n
			case 2: // kill a process and start another
				children[c].kill()
				start(c)
				kills++
			}
		}
	}
	faults := time.Since(began)
	for _, c := range children {
		c.kill()
	}

	// Every permit comes back once its TTL ends: a newcomer gets all of them.
	l, err := fencelock.NewLessor(db.Pool, fencelock.WithHolder("newcomer"))
	require.NoError(t, err)
	s, err := fencelock.NewSemaphore(l, sem, limit)
	require.NoError(t, err)
	actx, cancel := context.WithTimeout(ctx, 5*ttl+5*time.Second) // a dead waiter's place lives up to queueLiveness(ttl) too
	defer cancel()
	reclaimStart := time.Now()
	var held []*fencelock.Lease
	for range limit {
		p, err := s.Acquire(actx, 10*time.Second)
		require.NoError(t, err, "a permit was lost for good")
		held = append(held, p)
	}
	reclaimed := time.Since(reclaimStart)
	_, err = s.TryAcquire(ctx, time.Second)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	st, err := s.State(ctx)
	require.NoError(t, err)
	require.Equal(t, fencelock.SemaphoreState{Limit: limit, Held: limit}, st, "no waiter left behind")
	for _, p := range held {
		require.NoError(t, p.Release(ctx))
	}

	// The log.
	rows, err := db.Pool.Query(ctx, `SELECT name, token, acquired_at, expires_at, released FROM sem_log ORDER BY id`)
	require.NoError(t, err)
	spans := map[int64]*permitSpan{}
	lastToken := map[string]int64{}
	for rows.Next() {
		var sp permitSpan
		require.NoError(t, rows.Scan(&sp.name, &sp.token, &sp.from, &sp.to, &sp.released))
		if cur := spans[sp.token]; cur != nil {
			cur.to, cur.released = sp.to, sp.released
			continue
		}
		require.Greater(t, sp.token, lastToken[sp.name], "tokens of permit %s rise", sp.name)
		lastToken[sp.name] = sp.token
		spans[sp.token] = &sp
	}
	require.NoError(t, rows.Err())
	type event struct {
		at    time.Time
		delta int
	}
	var events []event
	lapsed := 0
	for _, sp := range spans {
		if !sp.to.After(sp.from) {
			continue
		}
		events = append(events, event{sp.from, 1}, event{sp.to, -1})
		if !sp.released {
			lapsed++
		}
	}
	sort.Slice(events, func(i, j int) bool {
		if events[i].at.Equal(events[j].at) {
			return events[i].delta < events[j].delta // an end at t frees before a start at t
		}
		return events[i].at.Before(events[j].at)
	})
	maxHeld, cur := 0, 0
	for _, ev := range events {
		cur += ev.delta
		maxHeld = max(maxHeld, cur)
	}
	// At each grant, the permits unexpired (itself included) are within the limit then in force
	// (a lowered limit ends no permit, so the count may stay above it, but no grant happens
	// there).
	lrows, err := db.Pool.Query(ctx, `SELECT at, permit_limit FROM sem_limits ORDER BY at`)
	require.NoError(t, err)
	type change struct {
		at    time.Time
		limit int
	}
	var changes []change
	for lrows.Next() {
		var c change
		require.NoError(t, lrows.Scan(&c.at, &c.limit))
		changes = append(changes, c)
	}
	require.NoError(t, lrows.Err())
	limitAt := func(at time.Time) int {
		l := limit
		for _, c := range changes {
			if c.at.Before(at) {
				l = c.limit
			}
		}
		return l
	}
	grantsUnderLowered := 0
	for _, g := range spans {
		n := 0
		for _, sp := range spans {
			if !sp.from.After(g.from) && sp.to.After(g.from) {
				n++
			}
		}
		if lim := limitAt(g.from); lim < limit {
			grantsUnderLowered++
			require.LessOrEqual(t, n, lim, "grant of %s (token %d) made %d permits unexpired under a limit of %d", g.name, g.token, n, lim)
		} else {
			require.LessOrEqual(t, n, lim, "grant of %s (token %d) made %d permits unexpired", g.name, g.token, n)
		}
	}
	t.Logf("chaos: scenario=%s grants=%d (%d under the lowered limit of 3; by phase %v) lapsed=%d max_unexpired=%d limit=%d pauses=%d backends_terminated=%d processes_killed=%d faults_for=%v all_permits_back_in=%v",
		e.report.Scenario, len(spans), grantsUnderLowered, phaseGrants, lapsed, maxHeld, limit, pauses, terminated, kills, faults.Round(time.Millisecond), reclaimed.Round(time.Millisecond))
	require.LessOrEqual(t, maxHeld, limit, "more permits unexpired at once than the limit")
	// The invariants held; now whether the run had the power to say so.
	require.Empty(t, short)
	require.Positive(t, grantsUnderLowered, "no grant while the limit was lowered")
	require.Equal(t, limit, maxHeld, "the workload never filled the semaphore")
	require.Greater(t, len(spans), 200, "too few grants to say anything")
	if pauses+kills > 0 {
		require.Positive(t, lapsed, "no permit lapsed although processes were paused or killed holding them")
	}
}
