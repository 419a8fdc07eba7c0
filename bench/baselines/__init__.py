"""The designs schedlock is compared with, implemented faithfully as separate processes."""
