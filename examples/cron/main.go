// Command cron shows a scheduled job that runs once per slot across replica processes, some of
// them killed at random.
//
// It starts five replica processes (this program again, as children), each running job.Job.Every
// (package github.com/fencelock/fencelock/job) for the job "cron:report" with slots of 200 ms on
// the database clock. A slot's run appends a row to cron_runs with a fenced write (the job lease's
// token), and works for up to 50 ms. Every 300 ms the parent kills one replica with SIGKILL,
// wherever it is (a run killed midway leaves its slot crashed in the ledger; this job does not
// retry crashed slots, so that slot is missed) and starts a new one. It kills only replicas
// that are running the job (a replica says so once it has connected), and never the first
// one, the steady replica, which runs from before the first slot to after the last: every slot
// in between is settled by it if not by another (run, found run, or given up past its horizon
// and recorded missed), however far behind a loaded machine puts it. Without it, a slot whose
// replicas were all killed before they reached it, with the next replica starting past its
// horizon, was left with no row, which a loaded machine made common. After the run it stops
// the other replicas, waits until every slot up to the last one run has its row in the
// ledger (the steady replica catching up), stops the steady one, and counts, from the
// database:
//
//	cron: slots=N runs=R duplicate_runs=D missed_slots=M
//
// N: the slots from the first run's to the last's; R: rows in cron_runs; D: runs beyond one per
// slot (must be 0); M: slots with no run. It exits non-zero (after a line saying why, and the
// counts as its last line) unless D is 0, every row of cron_runs was written by the run that
// owns its slot in the ledger (fencelock.job_runs, same token), R > 0, and every missed slot is
// explained by a kill: its run was killed (the ledger reads crashed, or running when the kill
// came less than a TTL before the count), or the slot was given up while a killed replica held
// the job's lease past the slot's horizon (missed). A SIGTERM lets a replica finish its run.
//
// Run it with an embedded PostgreSQL (local server binaries or Docker, through package pgtest):
//
//	go run ./examples/cron
//
// or against a database of your own, where it drops and recreates its table cron_runs and
// deletes the job's ledger rows (fencelock.job_runs where job = 'cron:report'):
//
//	DATABASE_URL=postgres://... go run ./examples/cron
//
// FENCELOCK_CRON_SECONDS sets how long the replicas run (default 4).
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/examples/internal/demodb"
	"github.com/fencelock/fencelock/job"
)

const (
	jobName  = "cron:report"
	every    = 200 * time.Millisecond
	replicas = 5
	killGap  = 300 * time.Millisecond
	jobTTL   = time.Second

	replicaEnv = "FENCELOCK_CRON_REPLICA" // set in a child: its replica id
	steady     = "replica-1"              // the replica never killed
	readyLine  = "ready"                  // a replica's stdout line: connected, about to run the job
	urlEnv     = "FENCELOCK_CRON_URL"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if id := os.Getenv(replicaEnv); id != "" {
		// The parent holds our stdin open: its end (the parent died, however) ends us too.
		ctx, cancel := context.WithCancel(ctx)
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			cancel()
		}()
		if err := replica(ctx, id, os.Getenv(urlEnv)); err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "cron replica", id+":", err)
			os.Exit(1)
		}
		return
	}
	sum, err := run(ctx)
	fail := err != nil
	switch {
	case err != nil:
		fmt.Println("cron: FAIL:", err)
	case sum.duplicates != 0 || sum.foreign != 0:
		fmt.Printf("cron: FAIL: %d slots ran more than once, %d writes by a run that does not own its slot\n", sum.duplicates, sum.foreign)
		fail = true
	case sum.runs == 0:
		fmt.Println("cron: FAIL: nothing ran")
		fail = true
	case sum.missed != sum.killed:
		fmt.Printf("cron: FAIL: %d slots missed, %d of them by a killed run or a killed holder of the job's lease\n", sum.missed, sum.killed)
		fail = true
	}
	if sum != nil { // the last line, FAIL or not
		fmt.Printf("cron: slots=%d runs=%d duplicate_runs=%d missed_slots=%d\n", sum.slots, sum.runs, sum.duplicates, sum.missed)
	}
	if fail {
		os.Exit(1)
	}
}

// replica runs the job until ctx ends (SIGTERM) or it is killed.
func replica(ctx context.Context, id, url string) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	lessor, err := fencelock.NewLessor(pool, fencelock.WithHolder(id))
	if err != nil {
		return err
	}
	j, err := job.New(lessor, jobName, jobTTL)
	if err != nil {
		return err
	}
	if err := pool.Ping(ctx); err != nil {
		return err
	}
	fmt.Println(readyLine) // to the parent: connected, about to run the job
	return j.Every(ctx, every, func(ctx context.Context, run *job.Run) error {
		time.Sleep(rand.N(50 * time.Millisecond)) // the report's work; a kill may land here
		// A SIGTERM lets the run finish (Every then stops): the write does not end with ctx.
		// A lost lease still stops it: FenceTx checks the lease in the write's transaction.
		wctx := context.WithoutCancel(ctx)
		return pgx.BeginFunc(wctx, pool, func(tx pgx.Tx) error {
			if err := run.Lease.FenceTx(wctx, tx, jobName); err != nil {
				return err
			}
			_, err := tx.Exec(wctx, `INSERT INTO cron_runs (slot, replica, token) VALUES ($1, $2, $3)`, run.Slot, id, int64(run.Lease.Token()))
			return err
		})
	}, func(slot time.Time, err error) {
		fmt.Fprintf(os.Stderr, "[%s] slot %s: %v\n", id, slot.Format("15:04:05.000"), err)
	})
}

type summary struct {
	slots, runs, duplicates, foreign, missed, killed int64
}

// run sets up the database, runs the replicas, kills some, and counts from the database.
func run(ctx context.Context) (_ *summary, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	seconds := 4
	if s := os.Getenv("FENCELOCK_CRON_SECONDS"); s != "" {
		if seconds, err = strconv.Atoi(s); err != nil || seconds < 1 {
			return nil, fmt.Errorf("FENCELOCK_CRON_SECONDS=%q: want a whole number of seconds >= 1", s)
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
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS cron_runs;
		CREATE TABLE cron_runs (slot timestamptz NOT NULL, replica text NOT NULL, token bigint NOT NULL);
		DELETE FROM fencelock.job_runs WHERE job = '`+jobName+`'`); err != nil {
		return nil, err
	}

	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	children := map[string]*exec.Cmd{}
	ready := map[string]bool{} // replicas that said readyLine
	var stdins []io.Closer     // each child's stdin: closed (by our exit, however it comes) it ends the child
	var wg sync.WaitGroup
	var waits sync.Map // *exec.Cmd -> chan struct{}, closed when it has exited
	waitDone := func(c *exec.Cmd) <-chan struct{} {
		d, _ := waits.Load(c)
		return d.(chan struct{})
	}
	steadyReady := make(chan struct{})
	n := 0
	start := func() error {
		n++
		id := "replica-" + strconv.Itoa(n)
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), replicaEnv+"="+id, urlEnv+"="+url)
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		stdins = append(stdins, in)
		mu.Lock()
		children[id] = cmd
		mu.Unlock()
		done := make(chan struct{})
		waits.Store(cmd, done)
		go func() {
			lines := bufio.NewScanner(out)
			for lines.Scan() {
				if lines.Text() == readyLine {
					mu.Lock()
					ready[id] = true
					mu.Unlock()
					if id == steady {
						close(steadyReady)
					}
				}
			}
			_, _ = io.Copy(io.Discard, out) // the rest, should the scanner stop early
			_ = cmd.Wait()                  // after the reads: Wait closes the pipe
			close(done)
		}()
		return nil
	}
	stop := func(all bool) {
		mu.Lock()
		for id, c := range children {
			if id == steady && !all {
				continue
			}
			_ = c.Process.Signal(syscall.SIGTERM)
			delete(children, id)
			killLater := time.AfterFunc(5*time.Second, func() { _ = c.Process.Kill() }) // no grace beyond
			wg.Go(func() { <-waitDone(c); killLater.Stop() })
		}
		mu.Unlock()
		wg.Wait()
		if all {
			for _, in := range stdins {
				_ = in.Close()
			}
		}
	}
	defer stop(true)
	// The steady replica first, running the job before any other starts.
	if err := start(); err != nil {
		return nil, err
	}
	select {
	case <-steadyReady:
	case <-ctx.Done():
		return nil, fmt.Errorf("the steady replica never said it was ready: %w", ctx.Err())
	}
	for range replicas - 1 {
		if err := start(); err != nil {
			return nil, err
		}
	}
	fmt.Printf("%d replicas run job %q, slots of %v, for %ds; one running it, not %s, is killed every %v\n", replicas, jobName, every, seconds, steady, killGap)
	end := time.After(time.Duration(seconds) * time.Second)
	tick := time.NewTicker(killGap)
	defer tick.Stop()
	killed, spared := 0, 0
loop:
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-end:
			break loop
		case <-tick.C:
			// A random one of the replicas running the job, not the steady one.
			mu.Lock()
			var up []string
			for id := range children {
				if ready[id] && id != steady {
					up = append(up, id)
				}
			}
			if len(up) == 0 {
				mu.Unlock()
				spared++
				continue
			}
			id := up[rand.N(len(up))]
			_ = children[id].Process.Kill()
			delete(children, id)
			mu.Unlock()
			killed++
			if err := start(); err != nil {
				return nil, err
			}
		}
	}
	stop(false)
	fmt.Printf("killed %d replicas with SIGKILL (%d times none was killed: no replica but the steady one was running the job)\n", killed, spared)
	// The steady replica catches up: every slot up to the last one run gets its row.
	for {
		var gaps int
		if err := pool.QueryRow(ctx, `
			WITH span AS (
				SELECT min(slot) AS first, max(slot) AS last FROM fencelock.job_ledger WHERE job = $1
			)
			SELECT count(*) FROM span, generate_series(span.first, span.last, $2::interval) AS g
			WHERE NOT EXISTS (SELECT 1 FROM fencelock.job_ledger AS l WHERE l.job = $1 AND l.slot = g)`,
			jobName, every.String()).Scan(&gaps); err != nil {
			return nil, fmt.Errorf("the ledger's gaps: %w", err)
		}
		if gaps == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the steady replica did not settle %d slot(s) of the ledger: %w", gaps, ctx.Err())
		case <-time.After(every / 4):
		}
	}
	stop(true)

	var s summary
	// Every replica has exited: a run the ledger reads running lost its replica to a SIGKILL
	// less than a TTL ago. A killed run (crashed, running) and a slot given up while a killed
	// replica held the job's lease (missed) explain a missed slot; nothing else does.
	err = pool.QueryRow(ctx, `
		WITH span AS (
			SELECT min(slot) AS first, max(slot) AS last FROM fencelock.job_ledger WHERE job = $1
		), grid AS (
			SELECT g AS slot FROM span, generate_series(span.first, span.last, $2::interval) AS g
		)
		SELECT (SELECT count(*) FROM grid),
		       (SELECT count(*) FROM cron_runs),
		       (SELECT count(*) - count(DISTINCT slot) FROM cron_runs),
		       (SELECT count(*) FROM cron_runs AS r
		         WHERE NOT EXISTS (SELECT 1 FROM fencelock.job_runs AS j WHERE j.job = $1 AND j.slot = r.slot AND j.token = r.token)),
		       (SELECT count(*) FROM grid WHERE NOT EXISTS (SELECT 1 FROM cron_runs AS r WHERE r.slot = grid.slot)),
		       (SELECT count(*) FROM grid JOIN fencelock.job_ledger AS l ON l.job = $1 AND l.slot = grid.slot
		         WHERE l.outcome IN ('crashed', 'running', 'missed') AND NOT EXISTS (SELECT 1 FROM cron_runs AS r WHERE r.slot = grid.slot))`,
		jobName, every.String()).Scan(&s.slots, &s.runs, &s.duplicates, &s.foreign, &s.missed, &s.killed)
	if err != nil {
		return nil, fmt.Errorf("count: %w", err)
	}
	// Each missed slot, with what the ledger says of it.
	rows, err := pool.Query(ctx, `
		WITH span AS (
			SELECT min(slot) AS first, max(slot) AS last FROM fencelock.job_ledger WHERE job = $1
		)
		SELECT g, coalesce(l.outcome, 'no run'), coalesce(l.holder, '')
		FROM span, generate_series(span.first, span.last, $2::interval) AS g
		LEFT JOIN fencelock.job_ledger AS l ON l.job = $1 AND l.slot = g
		WHERE NOT EXISTS (SELECT 1 FROM cron_runs AS r WHERE r.slot = g)
		ORDER BY g`, jobName, every.String())
	if err != nil {
		return nil, fmt.Errorf("missed slots: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var slot time.Time
		var outcome, holder string
		if err := rows.Scan(&slot, &outcome, &holder); err != nil {
			return nil, err
		}
		fmt.Printf("missed slot %s: %s %s\n", slot.UTC().Format("15:04:05.000"), outcome, holder)
	}
	return &s, rows.Err()
}
