//go:build unix

package pgtest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/fencelock/fencelock/internal/pgserver"
)

// writeNodeConfig writes n's patroni.json (JSON is YAML, which Patroni reads).
func (c *PatroniCluster) writeNodeConfig(n *patroniNode, binDir, etcdHost string, settings []setting) error {
	if err := os.Mkdir(n.dir, 0o700); err != nil {
		return fmt.Errorf("pgtest: patroni: %w", err)
	}
	if err := pgserver.ChownTo(n.dir, c.procs.cred); err != nil {
		return fmt.Errorf("pgtest: patroni: %w", err)
	}
	params := map[string]string{}
	for _, s := range settings {
		params[s.Name] = s.Value
	}
	hba := []string{
		"local all all trust",
		"host all all 127.0.0.1/32 trust",
		"host replication all 127.0.0.1/32 trust",
	}
	user := map[string]string{"username": "postgres"}
	pgAddr := "127.0.0.1:" + strconv.Itoa(n.pgPort)
	apiAddr := "127.0.0.1:" + strconv.Itoa(n.apiPort)
	cfg := map[string]any{
		"scope":     patroniScope,
		"namespace": "/pgtest/",
		"name":      n.name,
		"restapi":   map[string]any{"listen": apiAddr, "connect_address": apiAddr},
		"etcd3":     map[string]any{"hosts": []string{etcdHost}},
		"bootstrap": map[string]any{
			"dcs": map[string]any{
				"ttl":                     patroniTTL,
				"loop_wait":               patroniLoopWait,
				"retry_timeout":           patroniRetryTimeout,
				"maximum_lag_on_failover": 1 << 20,
				"postgresql": map[string]any{
					"use_pg_rewind": true,
					"use_slots":     true,
					"parameters":    params,
				},
			},
			"initdb": []any{map[string]string{"encoding": "UTF8"}, map[string]string{"locale": "C"}, "no-sync"},
		},
		"postgresql": map[string]any{
			"listen":          pgAddr,
			"connect_address": pgAddr,
			"data_dir":        filepath.Join(n.dir, "data"),
			"bin_dir":         binDir,
			"pgpass":          filepath.Join(n.dir, "pgpass"),
			"authentication":  map[string]any{"superuser": user, "replication": user, "rewind": user},
			"parameters":      map[string]string{"unix_socket_directories": n.dir},
			"pg_hba":          hba,
			"basebackup":      []any{map[string]string{"checkpoint": "fast"}},
		},
		"watchdog": map[string]any{"mode": "off"},
	}
	text, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return fmt.Errorf("pgtest: patroni: %w", err)
	}
	return writePatroniFile(filepath.Join(n.dir, "patroni.json"), string(text), c.procs.cred)
}

// writePatroniFile writes text to a new file at path, readable only by its owner, cred's user.
func writePatroniFile(path, text string, cred *syscall.Credential) error {
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return fmt.Errorf("pgtest: patroni: %w", err)
	}
	if err := pgserver.ChownTo(path, cred); err != nil {
		return fmt.Errorf("pgtest: patroni: %w", err)
	}
	return nil
}
