--[[
pswift's job_submit.lua, for a site without one of its own (JobSubmitPlugins=lua; next to
slurm.conf): every submission through pswift's rules in pswift_job_submit.lua, the module beside
this file (`pswift admin install-plugins` writes both). A site with its own job_submit.lua calls
the module instead (docs/admin.md).
]]

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local pswift = dofile(here .. "pswift_job_submit.lua")

function slurm_job_submit(job_desc, part_list, submit_uid)
   return pswift.check(job_desc, part_list, submit_uid)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
