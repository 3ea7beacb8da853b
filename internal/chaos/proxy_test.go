package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// toxiProxy is a toxiproxy proxy run in-process (as a Go library, no toxiproxy server) on
// loopback, between a holder's pool and the pgtest server.
type toxiProxy struct {
	p *toxiproxy.Proxy
}

// newToxiProxy starts a proxy to the server of dbURL and returns it with a pool config that
// connects through it. The proxy stops when the test ends.
func newToxiProxy(t *testing.T, dbURL string) (*toxiProxy, *pgxpool.Config) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	upstream := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "pg", "127.0.0.1:0", upstream)
	require.NoError(t, p.Start())
	t.Cleanup(p.Stop)
	host, port, err := net.SplitHostPort(p.Listen) // the address actually bound
	require.NoError(t, err)
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(n), nil
	return &toxiProxy{p: p}, cfg
}

// add adds a toxic of type typ ("latency", "timeout", "reset_peer", ...) named name to
// stream ("upstream": client to server, "downstream": server to client), with attributes
// in milliseconds. It applies to the proxy's open connections and to new ones.
func (tp *toxiProxy) add(name, typ, stream string, attrs map[string]int64) error {
	b, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if err != nil {
		return err
	}
	if _, err := tp.p.Toxics.AddToxicJson(bytes.NewReader(b)); err != nil {
		return fmt.Errorf("add toxic %s: %w", name, err)
	}
	return nil
}

// remove removes the toxic name, if present.
func (tp *toxiProxy) remove(name string) {
	_ = tp.p.Toxics.RemoveToxic(context.Background(), name)
}

// reset removes every toxic and closes every proxied connection (a half-open connection
// whose bytes a blackhole dropped cannot resume): clients see their connections break.
func (tp *toxiProxy) reset() error {
	tp.p.Toxics.ResetToxics(context.Background())
	tp.p.Stop()
	return tp.p.Start()
}
