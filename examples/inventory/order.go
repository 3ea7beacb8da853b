package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"github.com/fencelock/fencelock"
)

// item is a row of inventory. FenceToken is the column fencelock.protect_table's trigger keeps;
// the pods never set it themselves (they pass their token with fencelock.set_token).
type item struct {
	SKU          string `gorm:"column:sku;primaryKey"`
	InitialStock int
	Stock        int
	FenceToken   *int64
}

func (item) TableName() string { return "inventory" }

// order is a row of orders, appended by each sale that committed.
type order struct {
	ID    int64
	SKU   string `gorm:"column:sku"`
	Pod   string
	Token int64
}

func (order) TableName() string { return "orders" }

// staleRejection is a row of inventory_stale_rejections.
type staleRejection struct {
	SKU          string `gorm:"column:sku"`
	Pod          string
	Token        int64
	CurrentToken int64
}

func (staleRejection) TableName() string { return "inventory_stale_rejections" }

// errSoldOut rolls back an order of a SKU that another pod sold out meanwhile.
var errSoldOut = errors.New("sold out")

// placeOrder sells one unit of the lease's SKU in one GORM transaction: fence, pass the token,
// decrement if in stock, append. It reports whether it sold one (false: the SKU was sold out).
// A lost lease comes back as a *fencelock.LeaseLostError, a stale token as a
// *fencelock.StaleTokenError (from the fence) or an error matching fencelock.ErrStaleToken
// (from the trigger), with the transaction rolled back.
func placeOrder(ctx context.Context, gdb *gorm.DB, lease *fencelock.Lease, holder, sku string) (bool, error) {
	token := int64(lease.Token())
	err := gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// GORM runs the transaction on a *sql.Tx of the shared pool; fencelock's database/sql
		// forms take it.
		sqlTx, ok := tx.Statement.ConnPool.(*sql.Tx)
		if !ok {
			return fmt.Errorf("gorm transaction runs on a %T, not a *sql.Tx", tx.Statement.ConnPool)
		}
		// The fence: checks the lease is still ours and advances fencelock.fences("sku:<sku>")
		// to our token, or fails. Its row stays locked until commit, so fenced writers of one
		// SKU run one after the other and the conditional decrement below sees the previous
		// sale.
		if err := lease.FenceSQLTx(ctx, sqlTx, lease.Name()); err != nil {
			return err
		}
		// The token for inventory's trigger, for the rest of this transaction. (Setting the
		// fence_token column in the UPDATE would do too.)
		if err := tx.Exec(`SELECT fencelock.set_token(?)`, token).Error; err != nil {
			return fmt.Errorf("set token: %w", fencelock.WrapSQLError(err))
		}
		res := tx.Model(&item{}).Where("sku = ? AND stock > 0", sku).Update("stock", gorm.Expr("stock - 1"))
		if res.Error != nil {
			return fmt.Errorf("decrement %s: %w", sku, fencelock.WrapSQLError(res.Error))
		}
		if res.RowsAffected == 0 {
			return errSoldOut
		}
		if err := tx.Create(&order{SKU: sku, Pod: holder, Token: token}).Error; err != nil {
			return fmt.Errorf("append order of %s: %w", sku, err)
		}
		return nil
	})
	if errors.Is(err, errSoldOut) {
		return false, nil
	}
	return err == nil, err
}

// writeStale sells one unit of sku with token as a pod paused between its check and its write
// would: its check (the SKU was in stock) was made before the pause, and its write carries
// only its token. It decrements the stock unconditionally and appends an order, through GORM,
// in one transaction. On a protected inventory the trigger refuses it when a newer token has
// written the row. Errors are the driver's, wrapped: fencelock.WrapSQLError maps a refusal's
// SQLSTATE to its sentinel (FL004: fencelock.ErrStaleToken).
func writeStale(ctx context.Context, gdb *gorm.DB, token int64, holder, sku string) error {
	return gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`SELECT fencelock.set_token(?)`, token).Error; err != nil {
			return fmt.Errorf("set token: %w", err)
		}
		res := tx.Model(&item{}).Where("sku = ?", sku).Update("stock", gorm.Expr("stock - 1"))
		if res.Error != nil {
			return fmt.Errorf("decrement %s: %w", sku, res.Error)
		}
		if err := tx.Create(&order{SKU: sku, Pod: holder, Token: token}).Error; err != nil {
			return fmt.Errorf("append order of %s: %w", sku, err)
		}
		return nil
	})
}

// recordRejection notes a write the trigger rejected as stale, in a transaction of its own (the
// rejected one was rolled back), so the summary counts rejections from the database. The
// row's token, which the trigger compared the writer's with, is in the error's DETAIL
// ("current=N").
func recordRejection(ctx context.Context, gdb *gorm.DB, holder, sku string, token int64, rejected error) error {
	var pgErr *pgconn.PgError
	var current int64
	if !errors.As(rejected, &pgErr) {
		return fmt.Errorf("stale write of %s: no server error in %w", sku, rejected)
	}
	if _, err := fmt.Sscanf(pgErr.Detail, "current=%d", &current); err != nil {
		return fmt.Errorf("stale write of %s: DETAIL %q: %w", sku, pgErr.Detail, err)
	}
	err := gdb.WithContext(ctx).Create(&staleRejection{SKU: sku, Pod: holder, Token: token, CurrentToken: current}).Error
	if err != nil {
		return fmt.Errorf("record stale rejection of %s: %w", sku, err)
	}
	return nil
}

// inStock lists the SKUs that have stock left.
func inStock(ctx context.Context, gdb *gorm.DB) ([]string, error) {
	var skus []string
	if err := gdb.WithContext(ctx).Model(&item{}).Where("stock > 0").Order("sku").Pluck("sku", &skus).Error; err != nil {
		return nil, fmt.Errorf("list SKUs in stock: %w", err)
	}
	return skus, nil
}
