// Command river-bench runs River (github.com/riverqueue/river) as its users run it, for the
// benchmark in bench/: River's own migrations, and a client that works one-shot jobs.
//
//	river-bench migrate --database-url URL
//	river-bench work --name NAME --database-url URL --target-url URL --status-file PATH
//
// Jobs are the rows of schedlock_publishes, one job per row (kind "schedlock_fire"), inserted
// with its due time as ScheduledAt (see bench/peers/river_jobs.sql). The worker POSTs the same
// JSON body as schedlock and the baselines to the recording app, so the receiver measures all
// systems alike. Every River setting is its default except the queue's MaxWorkers, which River
// requires to be set (100, the value of River's own examples), and the client ID, set to the
// replica's name so that river_leader names the leader the way the harness names replicas.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// FireArgs is one row to fire: the fields of the body the recording app expects.
type FireArgs struct {
	ID          int64           `json:"id"`
	UID         string          `json:"uid"`
	Namespace   string          `json:"namespace"`
	Name        string          `json:"name"`
	Target      string          `json:"target"`
	ScheduledAt string          `json:"scheduledAt"`
	Payload     json.RawMessage `json:"payload"`
}

func (FireArgs) Kind() string { return "schedlock_fire" }

type body struct {
	FireArgs
	Attempt int     `json:"attempt"`
	Term    *string `json:"term"`
	Holder  string  `json:"holder"`
}

// FireWorker POSTs a job's row to the target; a non-2xx answer is an error (River retries).
type FireWorker struct {
	river.WorkerDefaults[FireArgs]
	holder    string
	targetURL string
	http      *http.Client
}

func (w *FireWorker) Work(ctx context.Context, job *river.Job[FireArgs]) error {
	data, err := json.Marshal(body{FireArgs: job.Args, Attempt: job.Attempt, Holder: w.holder})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.targetURL, bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", job.Args.UID+"/"+job.Args.ScheduledAt)
	resp, err := w.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 300 {
		return fmt.Errorf("target answered %d", resp.StatusCode)
	}
	return nil
}

func pool(ctx context.Context, url, name string) (*pgxpool.Pool, error) {
	config, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	config.ConnConfig.RuntimeParams["application_name"] = name
	return pgxpool.NewWithConfig(ctx, config)
}

func migrate(ctx context.Context, url string) error {
	dbPool, err := pool(ctx, url, "river-migrate")
	if err != nil {
		return err
	}
	defer dbPool.Close()
	migrator, err := rivermigrate.New(riverpgxv5.New(dbPool), nil)
	if err != nil {
		return err
	}
	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

func writeStatus(path string, values map[string]any) error {
	data, err := json.Marshal(values)
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.%d", filepath.Base(path), os.Getpid()))
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func work(ctx context.Context, name, url, targetURL, statusFile string) error {
	dbPool, err := pool(ctx, url, name)
	if err != nil {
		return err
	}
	defer dbPool.Close()
	workers := river.NewWorkers()
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 100
	river.AddWorker(workers, &FireWorker{
		holder:    name,
		targetURL: targetURL,
		http:      &http.Client{Timeout: 10 * time.Second, Transport: transport},
	})
	client, err := river.NewClient(riverpgxv5.New(dbPool), &river.Config{
		ID:      name,
		Logger:  slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 100}},
		Workers: workers,
	})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	status := map[string]any{"name": name, "pid": os.Getpid(), "ready": true}
	if err := writeStatus(statusFile, status); err != nil {
		return err
	}
	<-ctx.Done()
	// SIGTERM: River's graceful stop (finish running jobs, resign leadership).
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return client.Stop(stopCtx)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: river-bench migrate|work [flags]")
		os.Exit(2)
	}
	flags := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	name := flags.String("name", "river", "replica name: River's client ID and application_name")
	url := flags.String("database-url", "", "PostgreSQL URL")
	targetURL := flags.String("target-url", "", "where jobs are POSTed")
	statusFile := flags.String("status-file", "", "JSON status file the harness reads")
	_ = flags.Parse(os.Args[2:])
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var err error
	switch os.Args[1] {
	case "migrate":
		err = migrate(ctx, *url)
	case "work":
		err = work(ctx, *name, *url, *targetURL, *statusFile)
	default:
		err = errors.New("unknown command " + os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "river-bench:", err)
		os.Exit(1)
	}
}
