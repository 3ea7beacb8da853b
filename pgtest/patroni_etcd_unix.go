//go:build unix

package pgtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"

	"github.com/fencelock/fencelock/internal/pgserver"
)

// startEtcd starts a one-member etcd serving clients on client and peers on peer (host:port)
// and waits until its /health says true.
func (c *PatroniCluster) startEtcd(ctx context.Context, bin, client, peer string) error {
	logPath := filepath.Join(c.dir, "etcd.log")
	r, err := c.spawn(bin, "etcd", logPath, nil,
		"--name", "pgtest",
		"--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", "http://"+client,
		"--advertise-client-urls", "http://"+client,
		"--listen-peer-urls", "http://"+peer,
		"--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "pgtest=http://"+peer,
		"--logger", "zap", "--log-level", "warn")
	if err != nil {
		return err
	}
	c.procs.etcd = r
	err = poll(ctx, "patroni: wait for etcd", func() (bool, error) {
		if r.HasExited() {
			return false, fmt.Errorf("etcd %w", pgserver.ErrExited)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+client+"/health", nil)
		if err != nil {
			return false, err
		}
		resp, err := c.http.Do(req)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte(`"true"`)), fmt.Errorf("etcd /health: %s %s", resp.Status, body)
	})
	if err != nil {
		return fmt.Errorf("%w\netcd log:\n%s", err, pgserver.LogTail(logPath, 0))
	}
	return nil
}
