-- POST one single-sample deletion per request, each naming the next id of a file.
-- Environment: WRK_IDS (one external id per line), WRK_DATASET, WRK_PATH, WRK_KEY, WRK_OUT.
local ids = {}
for line in io.lines(os.getenv("WRK_IDS")) do ids[#ids + 1] = line end
local dataset = os.getenv("WRK_DATASET")
local path = os.getenv("WRK_PATH")
local headers = {
  ["Content-Type"] = "application/json",
  ["Authorization"] = "Bearer " .. os.getenv("WRK_KEY"),
}
local i = 0

request = function()
  i = i + 1
  local id = ids[((i - 1) % #ids) + 1]
  local body = '{"dataset_id":' .. dataset .. ',"sample_ids":["' .. id .. '"]}'
  return wrk.format("POST", path, headers, body)
end

done = function(summary, latency, requests)
  local f = io.open(os.getenv("WRK_OUT"), "w")
  f:write(string.format(
    '{"requests":%d,"duration_us":%d,"non_2xx":%d,"socket_errors":%d,' ..
    '"p50_ms":%.3f,"p90_ms":%.3f,"p99_ms":%.3f,"max_ms":%.3f,"mean_ms":%.3f}',
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000, latency.mean / 1000))
  f:close()
end
