package ui_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/pgserver"
	"github.com/fencelock/fencelock/ui"
)

// A service mounts the live view in its admin server, under a prefix; here a lease held by
// worker-1 shows on its page.
func ExampleNew() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
	defer stop()
	lessor, err := fencelock.NewLessor(pool, fencelock.WithHolder("worker-1"))
	if err != nil {
		log.Fatal(err)
	}
	lease, err := lessor.TryAcquire(ctx, "payment:42", time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx) //nolint:errcheck // an example

	h, err := ui.New(pool) // in a service: a pool of the read-only role (README, "Least privilege")
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	admin := http.NewServeMux()
	admin.Handle("/locks/", http.StripPrefix("/locks", h))
	srv := httptest.NewServer(admin)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/locks/name?n=" + url.QueryEscape("payment:42"))
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.Status, strings.Contains(string(page), `<td class="holder">worker-1</td>`))
	// Output: 200 OK true
}
