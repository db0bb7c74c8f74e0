#!/usr/bin/env bash
# Reference solution (Harbor's oracle).
echo apple > "${WORKSPACE:-/workspace}/answer.txt"
