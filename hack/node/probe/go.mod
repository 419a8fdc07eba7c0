module schedlock.dev/hack/node/probe

go 1.24
