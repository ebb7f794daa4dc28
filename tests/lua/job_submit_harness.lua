-- Runs plugins/job_submit.lua outside slurmctld, as its job_submit/lua plugin calls it: a table
-- `slurm` with the constants and log functions the plugin uses, then slurm_job_submit(job_desc).
--   lua5.3 job_submit_harness.lua PLUGIN SCRIPT_FILE [REPEATS] [REQUEUE] [NAME] [WORK_DIR]
-- prints one line per message (user:/info:), then "rc=N requeue=V seconds_per_call=S".
local plugin, script_file, repeats, requeue = arg[1], arg[2], tonumber(arg[3] or "1"), arg[4]
local name, work_dir = arg[5] or "job", arg[6] or "/home/u"
local messages = {}
slurm = {SUCCESS = 0, ERROR = -1,
         log_user = function(fmt, ...) messages[#messages + 1] = "user: " .. string.format(fmt, ...) end,
         log_info = function(fmt, ...) messages[#messages + 1] = "info: " .. string.format(fmt, ...) end}
dofile(plugin)
local f = assert(io.open(script_file, "rb"))
local script = f:read("*a")   -- "*a": Lua 5.1 (Debian's slurmctld) and 5.3 (a source build) alike
f:close()
local rc, desc
local t0 = os.clock()
for _ = 1, repeats do
   messages = {}
   desc = {script = script, name = name, work_dir = work_dir,
           requeue = requeue ~= "" and requeue and tonumber(requeue) or nil}
   rc = slurm_job_submit(desc, {}, 0)
end
local per_call = (os.clock() - t0) / repeats
for _, m in ipairs(messages) do print(m) end
print(string.format("rc=%d requeue=%s seconds_per_call=%.9f", rc, tostring(desc.requeue), per_call))
