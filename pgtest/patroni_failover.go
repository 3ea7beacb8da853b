package pgtest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Switchover makes candidate the leader with `patronictl switchover --leader <leader>
// --candidate <candidate> --force` (any healthy replica Patroni picks when candidate is ""),
// waits until the new leader accepts writes, then until every other running member streams
// from it, and returns the change. Patroni stops the old leader's PostgreSQL (fast shutdown),
// promotes the candidate, which starts a new timeline, and restarts the old leader as its
// replica. It waits at most one minute, less if ctx ends first. Safe for concurrent use, but
// concurrent switchovers and failovers of one cluster race each other.
//
// Errors: an unknown or killed candidate, or the leader itself; patronictl's error with its
// output (if the deadline ends patronictl, its error is "signal: killed"); on a timeout
// while waiting for the new leader or its replicas, one wrapping [context.DeadlineExceeded].
func (c *PatroniCluster) Switchover(ctx context.Context, candidate string) (LeaderChange, error) {
	ctx, cancel := context.WithTimeout(ctx, leaderChangeTimeout)
	defer cancel()
	old, _, err := c.waitLeader(ctx, nil)
	if err != nil {
		return LeaderChange{}, err
	}
	args := []string{"switchover", "--leader", old.name, "--force"}
	if candidate != "" {
		n, err := c.node(candidate)
		if err != nil {
			return LeaderChange{}, err
		}
		if n == old {
			return LeaderChange{}, fmt.Errorf("pgtest: patroni: switchover: %s is the leader already", candidate)
		}
		if !slices.Contains(c.running(), n) {
			return LeaderChange{}, fmt.Errorf("pgtest: patroni: switchover: %s is not running (RestartNode it first)", candidate)
		}
		args = append(args, "--candidate", candidate)
	}
	began := time.Now()
	out, err := c.patronictl(ctx, args...)
	if err != nil {
		return LeaderChange{}, err
	}
	leader, timeline, err := c.waitLeader(ctx, func(name string) bool {
		return name != old.name && (candidate == "" || name == candidate)
	})
	if err != nil {
		return LeaderChange{}, fmt.Errorf("%w\npatronictl: %s", err, out)
	}
	change := LeaderChange{From: old.name, To: leader.name, Timeline: timeline, Elapsed: time.Since(began)}
	if err := c.waitStreaming(ctx, leader); err != nil {
		return change, err
	}
	return change, nil
}

// KillLeader kills (SIGKILL) the leader's Patroni process and then its postmaster, the way a
// machine dies, and waits until Patroni's automatic failover has made another running member
// the leader and it accepts writes: the old leader's key expires after its TTL (8 s), then a
// replica takes it at its next HA loop and promotes itself (a new timeline). It then waits
// until the remaining members stream from the new leader and returns the change, Elapsed
// measured from the kill. The killed member stays down until [PatroniCluster.RestartNode]. It
// waits at most one minute, less if ctx ends first. Safe for concurrent use.
//
// Errors: one if no other member runs (nothing could take over); signal errors; on timeout,
// one wrapping [context.DeadlineExceeded].
func (c *PatroniCluster) KillLeader(ctx context.Context) (LeaderChange, error) {
	ctx, cancel := context.WithTimeout(ctx, leaderChangeTimeout)
	defer cancel()
	old, _, err := c.waitLeader(ctx, nil)
	if err != nil {
		return LeaderChange{}, err
	}
	if len(c.running()) < 2 {
		return LeaderChange{}, fmt.Errorf("pgtest: patroni: kill leader: %s is the only running member; nothing could take over", old.name)
	}
	began := time.Now()
	if err := c.killNode(old); err != nil {
		return LeaderChange{}, err
	}
	leader, timeline, err := c.waitLeader(ctx, func(name string) bool { return name != old.name })
	if err != nil {
		return LeaderChange{}, err
	}
	change := LeaderChange{From: old.name, To: leader.name, Timeline: timeline, Elapsed: time.Since(began)}
	if err := c.waitStreaming(ctx, leader); err != nil {
		return change, err
	}
	return change, nil
}

// RestartNode starts the Patroni process of node, a member killed by
// [PatroniCluster.KillLeader], again, and returns once the member streams from the leader.
// Patroni recovers its PostgreSQL and rejoins it as a replica, rewinding it with pg_rewind if
// it had WAL the new leader lacks. It waits at most one minute, less if ctx ends first. Safe
// for concurrent use.
//
// Errors: an unknown node name; one if node is running; the start error; on timeout, one
// wrapping [context.DeadlineExceeded] with the tail of the member's log.
func (c *PatroniCluster) RestartNode(ctx context.Context, node string) error {
	ctx, cancel := context.WithTimeout(ctx, leaderChangeTimeout)
	defer cancel()
	n, err := c.node(node)
	if err != nil {
		return err
	}
	if err := c.startNode(n); err != nil {
		return err
	}
	leader, _, err := c.waitLeader(ctx, nil)
	if err == nil {
		err = c.waitStreaming(ctx, leader)
	}
	if err == nil {
		// Streaming means received, not replayed: a database created while the node was down
		// would answer "does not exist" there, and pgx would stop at it (see URL).
		var conn *pgx.Conn
		if conn, err = pgx.Connect(ctx, leader.url("postgres")); err == nil {
			err = c.waitReplicas(ctx, leader, conn)
			conn.Close(context.WithoutCancel(ctx))
		}
	}
	if err != nil {
		return fmt.Errorf("pgtest: patroni: restart %s: %w\n%s", node, err, c.nodeLog(n))
	}
	return nil
}
