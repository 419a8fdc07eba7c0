// Command probe is the test node's network probe: a static binary with no dependencies, run
// in pods to check what the cluster tests need of the network (tests/cluster/test_node.py).
//
//	probe serve ADDR     answer HTTP GET with "probe <hostname>" until SIGTERM (default :8080)
//	probe resolve NAME   print NAME's addresses, one a line, via /etc/resolv.conf (Go's resolver)
//	probe get URL        print the body of GET URL; exit 1 unless the status is 200
//
// Every client call has a five-second deadline, so a broken network fails a test instead of
// hanging it.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

const deadline = 5 * time.Second

func main() {
	args := os.Args[1:]
	if len(args) == 0 {
		args = []string{"serve", ":8080"}
	}
	var err error
	switch {
	case args[0] == "serve" && len(args) == 2:
		err = serve(args[1])
	case args[0] == "resolve" && len(args) == 2:
		err = resolve(args[1])
	case args[0] == "get" && len(args) == 2:
		err = get(args[1])
	default:
		err = fmt.Errorf("usage: probe serve ADDR | resolve NAME | get URL")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

func serve(addr string) error {
	hostname, _ := os.Hostname()
	server := &http.Server{
		Addr:              addr,
		ReadHeaderTimeout: deadline,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "probe %s\n", hostname)
		}),
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		_ = server.Shutdown(ctx)
	}()
	if err := server.ListenAndServe(); err != http.ErrServerClosed {
		return err
	}
	return nil
}

func resolve(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	if err != nil {
		return err
	}
	for _, addr := range addrs {
		fmt.Println(addr)
	}
	return nil
}

func get(url string) error {
	client := &http.Client{Timeout: deadline}
	response, err := client.Get(url)
	if err != nil {
		return err
	}
	defer response.Body.Close()
	body, err := io.ReadAll(response.Body)
	if err != nil {
		return err
	}
	fmt.Print(string(body))
	if response.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, response.Status)
	}
	return nil
}
