package pgtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/pgserver"
)

// patroniMember is one entry of GET /cluster of Patroni's REST API.
type patroniMember struct {
	Name  string `json:"name"`
	Role  string `json:"role"` // "leader", "replica", "sync_standby", ...
	State string `json:"state"`
}

// Leader returns the name of the member that holds the leader key in etcd, as the REST API
// (GET /cluster) of the first running member that answers reports it (when that member
// reports no leader, Leader says so without asking the others). Right after a leader
// dies its key lives on until its TTL (8 s) expires, so Leader may name a dead node then;
// [PatroniCluster.KillLeader] and [PatroniCluster.Switchover] wait for the new leader
// themselves. Safe for concurrent use.
//
// Errors: one if no member runs, none answers, or the cluster has no leader; ctx's error.
func (c *PatroniCluster) Leader(ctx context.Context) (string, error) {
	nodes := c.running()
	if len(nodes) == 0 {
		return "", fmt.Errorf("pgtest: patroni: leader: %w", errNoMember)
	}
	var errs []error
	for _, n := range nodes {
		var cluster struct {
			Members []patroniMember `json:"members"`
		}
		if err := c.getJSON(ctx, n, "/cluster", &cluster); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, m := range cluster.Members {
			if m.Role == "leader" {
				return m.Name, nil
			}
		}
		return "", fmt.Errorf("pgtest: patroni: leader: %s reports no leader (members %+v)", n.name, cluster.Members)
	}
	return "", fmt.Errorf("pgtest: patroni: leader: %w", errors.Join(errs...))
}

// getJSON decodes the answer of GET path on n's REST API into v.
func (c *PatroniCluster) getJSON(ctx context.Context, n *patroniNode, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(n.apiPort)+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s REST API: %w", n.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s REST API: GET %s: %s", n.name, path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("%s REST API: GET %s: %w", n.name, path, err)
	}
	return nil
}

// isPrimary reports whether n's PostgreSQL accepts connections and is out of recovery, and
// returns its timeline then.
func isPrimary(ctx context.Context, n *patroniNode) (bool, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.url("postgres"))
	if err != nil {
		return false, 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var inRecovery bool
	var tl string
	err = conn.QueryRow(ctx, `SELECT pg_is_in_recovery(),
		CASE WHEN pg_is_in_recovery() THEN '' ELSE substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8) END`).Scan(&inRecovery, &tl)
	if err != nil || inRecovery {
		return false, 0, err
	}
	timeline, err := strconv.ParseInt(tl, 16, 32)
	if err != nil {
		return false, 0, fmt.Errorf("timeline of WAL file %q: %w", tl, err)
	}
	return true, int(timeline), nil
}

// errNoMember says no member of the cluster runs: waiting for a leader is hopeless.
var errNoMember = errors.New("no member is running")

// poll calls try every 50 ms until it reports done, until the reason it gives wraps
// errNoMember or pgserver.ErrExited (hopeless), or until ctx ends; it then returns an error wrapping
// that reason (and ctx's error), prefixed with "pgtest: " and what.
func poll(ctx context.Context, what string, try func() (done bool, reason error)) error {
	for {
		done, reason := try()
		if done {
			return nil
		}
		if errors.Is(reason, errNoMember) || errors.Is(reason, pgserver.ErrExited) {
			return fmt.Errorf("pgtest: %s: %w", what, reason)
		}
		timer := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("pgtest: %s: %w (last: %w)", what, ctx.Err(), reason)
		case <-timer.C:
		}
	}
}

// tryLeader returns the member the leader key names if it runs, accept (nil: any) lets it
// through and its PostgreSQL is a primary, with its timeline; otherwise an error saying why
// not.
func (c *PatroniCluster) tryLeader(ctx context.Context, accept func(string) bool) (*patroniNode, int, error) {
	name, err := c.Leader(ctx)
	if err != nil {
		return nil, 0, err
	}
	if accept != nil && !accept(name) {
		return nil, 0, fmt.Errorf("the leader is still %s", name)
	}
	n, err := c.node(name)
	if err != nil {
		return nil, 0, err
	}
	ok, tl, err := isPrimary(ctx, n)
	if err != nil || !ok {
		return nil, 0, fmt.Errorf("leader %s is not a primary yet: %w", name, err)
	}
	return n, tl, nil
}

// waitLeader polls tryLeader until it succeeds.
func (c *PatroniCluster) waitLeader(ctx context.Context, accept func(string) bool) (*patroniNode, int, error) {
	var leader *patroniNode
	var timeline int
	err := poll(ctx, "patroni: wait for a leader that accepts writes", func() (bool, error) {
		var err error
		leader, timeline, err = c.tryLeader(ctx, accept)
		return err == nil, err
	})
	return leader, timeline, err
}

// tryStreaming returns nil if every running member other than leader streams WAL from it
// (pg_stat_replication on leader, state streaming), else an error saying which does not.
func (c *PatroniCluster) tryStreaming(ctx context.Context, leader *patroniNode) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, leader.url("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Patroni sets each replica's application_name to its member name.
	var streaming []string
	err = conn.QueryRow(ctx, `SELECT coalesce(array_agg(application_name::text ORDER BY application_name), '{}')
		FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&streaming)
	if err != nil {
		return err
	}
	for _, n := range c.running() {
		if n != leader && !slices.Contains(streaming, n.name) {
			return fmt.Errorf("%s streams to %q, not yet to %s", leader.name, streaming, n.name)
		}
	}
	return nil
}

// waitStreaming polls tryStreaming until it succeeds.
func (c *PatroniCluster) waitStreaming(ctx context.Context, leader *patroniNode) error {
	return poll(ctx, "patroni: wait for the replicas to stream from "+leader.name, func() (bool, error) {
		err := c.tryStreaming(ctx, leader)
		return err == nil, err
	})
}
